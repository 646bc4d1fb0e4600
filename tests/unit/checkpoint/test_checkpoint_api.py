"""The public names of rayguard.checkpoint are pinned; records and reports pickle (they cross Ray processes)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

import rayguard.checkpoint as ck
from rayguard.checkpoint.commit import commit
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointCorruptError, CheckpointError


def test_records_reports_and_errors_pickle(tmp_path: Path) -> None:
    record = write_shard(tmp_path / "s", 0, {"w": torch.ones(3)})
    assert pickle.loads(pickle.dumps(record)) == record
    commit(tmp_path / "s", tmp_path / "c", [record], world_size=1, step=0)
    report = ck.verify(tmp_path / "c")
    assert pickle.loads(pickle.dumps(report)) == report and report.ok
    result = ck.scan(tmp_path)
    assert pickle.loads(pickle.dumps(result)) == result
    for exc in (CheckpointError("x"), CheckpointCorruptError("y")):
        assert str(pickle.loads(pickle.dumps(exc))) == str(exc)
