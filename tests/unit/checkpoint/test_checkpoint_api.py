"""The public names of rayguard.checkpoint are pinned; records and reports pickle (they cross Ray processes)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

import rayguard.checkpoint as ck
from rayguard.exceptions import CheckpointCorruptError, CheckpointError


def test_public_names_are_pinned() -> None:
    assert set(ck.__all__) == {
        "RNG_STATE_KEY", "FileRecord", "LoadResult", "Manifest", "Problem", "Rejection", "ScanResult",
        "ShardRecord", "VerifyReport", "capture_rng_state", "cleanup_staging", "commit",
        "discard_staging", "find_latest_valid", "load", "load_latest_valid",
        "normalize_state_dict_keys", "read_manifest", "read_shard", "restore_rng_state", "save",
        "scan", "shard_rank_for", "staging_dir_for", "verify", "write_shard",
    }  # fmt: skip
    assert all(hasattr(ck, name) for name in ck.__all__)


def test_records_reports_and_errors_pickle(tmp_path: Path) -> None:
    record = ck.write_shard(tmp_path / "s", 0, {"w": torch.ones(3)})
    assert pickle.loads(pickle.dumps(record)) == record
    ck.commit(tmp_path / "s", tmp_path / "c", [record], world_size=1, step=0)
    report = ck.verify(tmp_path / "c")
    assert pickle.loads(pickle.dumps(report)) == report and report.ok
    result = ck.scan(tmp_path)
    assert pickle.loads(pickle.dumps(result)) == result
    for exc in (CheckpointError("x"), CheckpointCorruptError("y")):
        assert str(pickle.loads(pickle.dumps(exc))) == str(exc)
