"""``rayguard checkpoint verify|ls``: exit statuses and what they print (in-process, the
``run_cli`` fixture; ``tests/unit/cli/test_cli_smoke.py`` runs it as a process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import save
from rayguard.checkpoint.writer import shard_file_name


@pytest.fixture
def cli(run_cli):
    """``rayguard checkpoint <args>``, in-process."""
    return lambda *args: run_cli(["checkpoint", *args])


def test_verify_and_ls(tmp_path: Path, cli) -> None:
    for step in (1, 2):
        save(tmp_path / f"checkpoint_{step:06d}", {"w": torch.ones(1000), "step": step}, step=step)
    shard = tmp_path / "checkpoint_000002" / shard_file_name(0)
    os.truncate(shard, shard.stat().st_size - 1)

    bad = cli("verify", str(tmp_path / "checkpoint_000002"), "--json")
    assert bad.rc == 1, bad.stderr
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["problems"][0]["file"] == shard_file_name(0)
    assert "truncated" in doc["problems"][0]["what"]

    good = cli("verify", str(tmp_path / "checkpoint_000001"))
    assert good.rc == 0, good.stderr
    assert good.stdout.startswith("OK ") and "step 1" in good.stdout

    listing = cli("ls", str(tmp_path))
    assert listing.rc == 1, listing.stderr  # a listed checkpoint is CORRUPT
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["STEP", "SIZE", "STATUS", "PATH"]
    assert lines[1].split()[0] == "2" and "CORRUPT" in lines[1]
    assert "truncated" in lines[2]
    assert lines[3].split()[0] == "1" and "verified" in lines[3]


def test_missing_paths_are_not_found_exit_2(tmp_path: Path, cli) -> None:
    missing = str(tmp_path / "does" / "not" / "exist")
    for command in ("verify", "ls"):
        proc = cli(command, missing)
        assert proc.rc == 2, proc.stdout
        assert proc.stderr.strip() == f"rayguard checkpoint {command}: {missing}: not found"
        assert "CORRUPT" not in proc.stdout and "no checkpoints" not in proc.stdout
        doc = json.loads(cli(command, missing, "--json").stdout)
        assert doc == {"path": missing, "ok": None, "error": "not found"}
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "not a directory" in cli("ls", str(a_file)).stderr


def test_ls_exit_status_follows_verification(tmp_path: Path, cli) -> None:
    empty = cli("ls", str(tmp_path))
    assert empty.rc == 0 and "no checkpoints" in empty.stdout
    save(tmp_path / "checkpoint_000001", {"w": torch.ones(10), "step": 1}, step=1)
    assert cli("ls", str(tmp_path)).rc == 0
    assert cli("ls", "--json", str(tmp_path)).rc == 0
    (tmp_path / "checkpoint_000002").mkdir()  # a checkpoint directory without a manifest
    listing = cli("ls", str(tmp_path))
    assert listing.rc == 1 and "CORRUPT" in listing.stdout
    as_json = cli("ls", "--json", str(tmp_path))
    assert as_json.rc == 1
    assert [json.loads(line)["status"] for line in as_json.stdout.splitlines()] == ["CORRUPT", "verified"]


def test_a_checkpoint_reported_through_ray_train_report_is_listed_and_verified(
        tmp_path: Path, cli) -> None:
    from rayguard.checkpoint.reported import hash_directory, seal

    d = tmp_path / "checkpoint_2026-12-01_10-00-00.000000"
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "model.safetensors").write_bytes(b"x" * 100)
    seal(d, [hash_directory(d, 0)], world_size=2, step=40)
    ok = cli("verify", str(d))
    assert ok.rc == 0 and "reported through ray.train.report" in ok.stdout, ok.stdout
    listed = cli("ls", str(tmp_path))
    assert listed.rc == 0 and "(ray.train.report)" in listed.stdout, listed.stdout
    os.truncate(d / "checkpoint" / "model.safetensors", 10)
    bad = cli("verify", str(d))
    assert bad.rc == 1 and "truncated" in bad.stdout, bad.stdout
