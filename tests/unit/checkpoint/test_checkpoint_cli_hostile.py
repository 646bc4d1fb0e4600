"""``rayguard checkpoint verify|ls`` on directories that come from elsewhere: a manifest
path crafted with terminal escapes is printed inert (no fake green "OK" line), and a folder
with no manifest is named "not a rayguard checkpoint", apart from a damaged one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import save
from rayguard.checkpoint.manifest import MANIFEST_NAME

FAKE_OK = "x\n\x1b[1A\x1b[2K\x1b[32mOK everything verified\x1b[0m\r"


@pytest.fixture
def cli(run_cli):
    """``rayguard checkpoint <args>``, in-process."""
    return lambda *args: run_cli(["checkpoint", *args])


def _craft(ckpt: Path) -> None:
    doc = json.loads((ckpt / MANIFEST_NAME).read_text())
    doc["files"].append({**doc["files"][0], "path": FAKE_OK})
    (ckpt / MANIFEST_NAME).write_text(json.dumps(doc))


def _assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text, repr(text)
    assert not any(line.startswith("OK") for line in text.splitlines()), text


def test_crafted_manifest_path_prints_inert(tmp_path: Path, cli) -> None:
    ckpt = tmp_path / "checkpoint_000001"
    save(ckpt, {"w": torch.ones(10), "step": 1}, step=1)
    _craft(ckpt)
    verify = cli("verify", str(ckpt))
    assert verify.rc == 1 and verify.stdout.startswith("CORRUPT")
    _assert_inert(verify.stdout)
    assert "\\x1b[32mOK everything verified" in verify.stdout
    listing = cli("ls", str(tmp_path))
    assert listing.rc == 1
    _assert_inert(listing.stdout)
    for args in (("verify", str(ckpt), "--json"), ("ls", str(tmp_path), "--json")):
        assert "\x1b" not in cli(*args).stdout


def test_crafted_directory_name_prints_inert(tmp_path: Path, cli) -> None:
    ckpt = tmp_path / "checkpoint_9\x1b[2J"
    save(ckpt, {"w": torch.ones(10), "step": 9}, step=9)
    for args in (("verify", str(ckpt)), ("ls", str(tmp_path))):
        proc = cli(*args)
        assert proc.rc == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\\x1b[2J" in proc.stdout


def test_folder_without_manifest_is_not_a_rayguard_checkpoint(tmp_path: Path, cli) -> None:
    plain = tmp_path / "checkpoint_000000"  # what a plain TorchTrainer run leaves
    plain.mkdir()
    torch.save({"model": {"w": torch.ones(2)}}, plain / "checkpoint.pt")
    proc = cli("verify", str(plain))
    assert proc.rc == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("NOT A RAYGUARD CHECKPOINT") and "CORRUPT" not in proc.stdout
    assert MANIFEST_NAME in proc.stdout
    doc = json.loads(cli("verify", str(plain), "--json").stdout)
    assert doc["ok"] is None and doc["error"] == "not a rayguard checkpoint"


def test_damaged_manifest_is_still_corrupt_not_foreign(tmp_path: Path, cli) -> None:
    ckpt = tmp_path / "checkpoint_000001"
    save(ckpt, {"w": torch.ones(10), "step": 1}, step=1)
    (ckpt / MANIFEST_NAME).write_text("{ not json")
    proc = cli("verify", str(ckpt))
    assert proc.rc == 1 and proc.stdout.startswith("CORRUPT")
