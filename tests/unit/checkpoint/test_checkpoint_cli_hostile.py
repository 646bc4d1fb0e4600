"""``rayguard checkpoint verify|ls`` on directories that come from elsewhere: a manifest
path crafted with terminal escapes is printed inert (no fake green "OK" line), and a folder
with no manifest is named "not a rayguard checkpoint", apart from a damaged one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from rayguard.checkpoint import save
from rayguard.checkpoint.manifest import MANIFEST_NAME

FAKE_OK = "x\n\x1b[1A\x1b[2K\x1b[32mOK everything verified\x1b[0m\r"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rayguard", "checkpoint", *args],
                          capture_output=True, text=True, timeout=120)


def _craft(ckpt: Path) -> None:
    doc = json.loads((ckpt / MANIFEST_NAME).read_text())
    doc["files"].append({**doc["files"][0], "path": FAKE_OK})
    (ckpt / MANIFEST_NAME).write_text(json.dumps(doc))


def _assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text, repr(text)
    assert not any(line.startswith("OK") for line in text.splitlines()), text


def test_crafted_manifest_path_prints_inert(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint_000001"
    save(ckpt, {"w": torch.ones(10), "step": 1}, step=1)
    _craft(ckpt)
    verify = _cli("verify", str(ckpt))
    assert verify.returncode == 1 and verify.stdout.startswith("CORRUPT")
    _assert_inert(verify.stdout)
    assert "\\x1b[32mOK everything verified" in verify.stdout
    listing = _cli("ls", str(tmp_path))
    assert listing.returncode == 1
    _assert_inert(listing.stdout)
    for args in (("verify", str(ckpt), "--json"), ("ls", str(tmp_path), "--json")):
        assert "\x1b" not in _cli(*args).stdout


def test_crafted_directory_name_prints_inert(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint_9\x1b[2J"
    save(ckpt, {"w": torch.ones(10), "step": 9}, step=9)
    for args in (("verify", str(ckpt)), ("ls", str(tmp_path))):
        proc = _cli(*args)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\\x1b[2J" in proc.stdout


def test_folder_without_manifest_is_not_a_rayguard_checkpoint(tmp_path: Path) -> None:
    plain = tmp_path / "checkpoint_000000"  # what a plain TorchTrainer run leaves
    plain.mkdir()
    torch.save({"model": {"w": torch.ones(2)}}, plain / "checkpoint.pt")
    proc = _cli("verify", str(plain))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("NOT A RAYGUARD CHECKPOINT") and "CORRUPT" not in proc.stdout
    assert MANIFEST_NAME in proc.stdout
    doc = json.loads(_cli("verify", str(plain), "--json").stdout)
    assert doc["ok"] is None and doc["error"] == "not a rayguard checkpoint"


def test_damaged_manifest_is_still_corrupt_not_foreign(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint_000001"
    save(ckpt, {"w": torch.ones(10), "step": 1}, step=1)
    (ckpt / MANIFEST_NAME).write_text("{ not json")
    proc = _cli("verify", str(ckpt))
    assert proc.returncode == 1 and proc.stdout.startswith("CORRUPT")
