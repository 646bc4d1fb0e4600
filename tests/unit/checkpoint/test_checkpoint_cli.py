"""``rayguard checkpoint verify|ls`` through ``python -m rayguard`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from rayguard.checkpoint import save
from rayguard.checkpoint.writer import shard_file_name


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayguard", "checkpoint", *args], capture_output=True, text=True, timeout=120
    )


def test_verify_and_ls(tmp_path: Path) -> None:
    for step in (1, 2):
        save(tmp_path / f"checkpoint_{step:06d}", {"w": torch.ones(1000), "step": step}, step=step)
    shard = tmp_path / "checkpoint_000002" / shard_file_name(0)
    os.truncate(shard, shard.stat().st_size - 1)

    bad = _cli("verify", str(tmp_path / "checkpoint_000002"), "--json")
    assert bad.returncode == 1, bad.stderr
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["problems"][0]["file"] == shard_file_name(0)
    assert "truncated" in doc["problems"][0]["what"]

    good = _cli("verify", str(tmp_path / "checkpoint_000001"))
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("OK ") and "step 1" in good.stdout

    listing = _cli("ls", str(tmp_path))
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["STEP", "SIZE", "STATUS", "PATH"]
    assert lines[1].split()[0] == "2" and "CORRUPT" in lines[1]
    assert "truncated" in lines[2]
    assert lines[3].split()[0] == "1" and "verified" in lines[3]
