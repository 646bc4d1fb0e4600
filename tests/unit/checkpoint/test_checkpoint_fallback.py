"""Corrupt, truncated, incomplete, deleted or tampered checkpoints are rejected, logged, and
the newest valid one is loaded instead."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import find_latest_valid, load, load_latest_valid, save, scan, verify
from rayguard.checkpoint.fallback import Candidate, order_candidates
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.reader import read_shard
from rayguard.checkpoint.writer import shard_file_name
from rayguard.exceptions import CheckpointCorruptError

SHARD = shard_file_name(0)


def _state(step: int) -> dict:
    return {"w": torch.full((50_000,), float(step)), "step": step}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for step in (1, 2, 3):
        save(tmp_path / f"checkpoint_{step:06d}", _state(step), step=step)
    return tmp_path


def _newest(root: Path) -> Path:
    return root / "checkpoint_000003"


def _expect_fallback_to_2(root: Path, caplog: pytest.LogCaptureFixture, file: str, what: str) -> None:
    with caplog.at_level(logging.WARNING, logger="rayguard.checkpoint"):
        result = scan(root)
    assert result.chosen == root / "checkpoint_000002"
    assert load(result.chosen)["step"] == 2
    [rejection] = result.rejected
    assert rejection.path == str(_newest(root))
    assert rejection.problems[0].file == file and what in rejection.problems[0].what
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert str(_newest(root)) in warning and file in warning and what in warning
    # A rank loading directly gets the same answer, in one pass.
    loaded = load_latest_valid(root, 0)
    assert loaded.path == root / "checkpoint_000002" and loaded.state["step"] == 2
    assert [r.path for r in loaded.rejected] == [str(_newest(root))]


def test_flipped_byte_in_a_committed_shard(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = _newest(root) / SHARD
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    _expect_fallback_to_2(root, caplog, SHARD, "blake3 mismatch in bytes [0, ")
    with pytest.raises(CheckpointCorruptError, match="blake3 mismatch"):
        load(_newest(root))
    assert load(_newest(root), verify=False)["step"] == 3  # only an explicit opt-out reads it


def test_truncated_shard(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = _newest(root) / SHARD
    os.truncate(shard, shard.stat().st_size - 100)
    _expect_fallback_to_2(root, caplog, SHARD, "truncated")
    with pytest.raises(CheckpointCorruptError, match="truncated"):
        read_shard(_newest(root), 0)


def test_deleted_manifest(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    (_newest(root) / MANIFEST_NAME).unlink()
    _expect_fallback_to_2(root, caplog, MANIFEST_NAME, "never committed")


def test_deleted_shard(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    (_newest(root) / SHARD).unlink()
    _expect_fallback_to_2(root, caplog, SHARD, "missing")


def test_deleted_checkpoint_directory(root: Path) -> None:
    shutil.rmtree(_newest(root))
    found = find_latest_valid(root)
    assert found is not None and found[0] == root / "checkpoint_000002"
    assert load(found[0])["step"] == 2


def test_garbled_manifest(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    (_newest(root) / MANIFEST_NAME).write_text("{not json")
    _expect_fallback_to_2(root, caplog, MANIFEST_NAME, "manifest is invalid")


@pytest.mark.parametrize("evil", ["../checkpoint_000001/" + SHARD, "/etc/passwd", "a/../../x", "..\\x", ""])
def test_manifest_with_a_path_outside_the_checkpoint(root: Path, caplog: pytest.LogCaptureFixture, evil: str) -> None:
    manifest_path = _newest(root) / MANIFEST_NAME
    doc = json.loads(manifest_path.read_text())
    doc["files"][0]["path"] = evil
    manifest_path.write_text(json.dumps(doc))
    _expect_fallback_to_2(root, caplog, MANIFEST_NAME, "outside its checkpoint directory")
    with pytest.raises(CheckpointCorruptError, match="outside"):
        read_shard(_newest(root), 0, verify=False)


def test_symlink_escaping_the_checkpoint(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = _newest(root) / SHARD
    outside = root / "elsewhere.bin"
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    _expect_fallback_to_2(root, caplog, SHARD, "a symlink escapes it")


def test_all_bad_returns_none_and_skip_is_honoured(root: Path) -> None:
    for step in (1, 2, 3):
        (root / f"checkpoint_{step:06d}" / MANIFEST_NAME).unlink()
    result = scan(root)
    assert result.chosen is None and len(result.rejected) == 3
    assert find_latest_valid(root) is None
    assert load_latest_valid(root, 0).path is None
    assert find_latest_valid(root / "does-not-exist") is None


def test_rejected_checkpoints_are_not_tried_again(root: Path) -> None:
    skip = [_newest(root)]  # e.g. rejected by another rank
    result = scan(root, skip=skip)
    assert result.chosen == root / "checkpoint_000002" and result.rejected == ()
    assert load_latest_valid(root, 0, skip=skip).state["step"] == 2


def test_verify_reports_every_problem_at_once(root: Path) -> None:
    os.truncate(_newest(root) / SHARD, 10)
    report = verify(_newest(root))
    assert not report.ok and [p.file for p in report.problems] == [SHARD]
    assert report.to_dict()["step"] == 3 and verify(root / "checkpoint_000001").ok


def test_order_candidates_newest_step_first_then_mtime() -> None:
    c = [
        Candidate(Path("a"), step=5, mtime=10.0),
        Candidate(Path("b"), step=7, mtime=1.0),
        Candidate(Path("c"), step=7, mtime=2.0),
        Candidate(Path("d"), step=None, mtime=99.0),
        Candidate(Path("e"), step=None, mtime=0.0, manifest_readable=False),
    ]
    assert [x.path.name for x in order_candidates(c)] == ["e", "c", "b", "a", "d"]


def test_directories_that_are_not_checkpoints_are_ignored(root: Path) -> None:
    (root / "logs").mkdir()
    (root / ".hidden").mkdir()
    (root / "checkpoint_000009").mkdir()  # looks like one, no manifest: rejected, not ignored
    result = scan(root)
    assert result.chosen == _newest(root)
    assert [r.path for r in result.rejected] == [str(root / "checkpoint_000009")]
