"""The multi-rank protocol: write_shard per rank, commit once, read_shard per rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import read_manifest, verify
from rayguard.checkpoint.commit import cleanup_staging, commit, staging_dir_for
from rayguard.checkpoint.hashing import digest_bytes
from rayguard.checkpoint.manifest import release_of
from rayguard.checkpoint.reader import read_shard
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointError


def _save_ranks(final: Path, states: dict[int, object], world_size: int, step: int) -> Path:
    staging = staging_dir_for(final)
    records = [write_shard(staging, rank, state) for rank, state in states.items()]
    assert not (final / "rayguard_manifest.json").exists()  # nothing visible before the commit
    return commit(staging, final, records, world_size=world_size, step=step, metadata={"run": "r1"})


def test_each_rank_reads_its_own_shard(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_000012"
    _save_ranks(final, {r: {"rank": r, "w": torch.full((100,), float(r))} for r in range(3)}, 3, 12)
    manifest = read_manifest(final)
    assert (manifest.step, manifest.world_size, manifest.ranks) == (12, 3, [0, 1, 2])
    assert manifest.metadata == {"run": "r1"} and manifest.torch_version == release_of(torch.__version__)
    for r in range(3):
        state = read_shard(final, r)
        assert state["rank"] == r and torch.all(state["w"] == r)
    assert not staging_dir_for(final).exists()
    # The manifest's digests are the documented scheme over the file bytes.
    for f in manifest.files:
        assert digest_bytes((final / f.path).read_bytes()) == (f.digest, f.chunk_digests)


def test_replicated_state_saved_by_rank0_of_2_loads_on_rank3_of_4(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_000001"
    _save_ranks(final, {0: {"model": {"module.w": torch.arange(5.0)}}}, world_size=2, step=1)
    state = read_shard(final, 3)
    assert torch.equal(state["model"]["module.w"], torch.arange(5.0))


def test_no_shard_for_rank_and_none_for_rank0_is_a_clear_error(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_000001"
    _save_ranks(final, {1: {"x": 1}}, world_size=2, step=1)
    with pytest.raises(CheckpointError, match=r"no shard for rank 3 and none for rank 0.*ranks \[1\]"):
        read_shard(final, 3)
    assert read_shard(final, 1) == {"x": 1}


def test_commit_into_an_existing_empty_dir_and_refusal_of_a_full_one(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_a"
    final.mkdir()  # e.g. created by the caller ahead of time
    _save_ranks(final, {0: {"x": 1}}, 1, 1)
    assert verify(final).ok
    staging = staging_dir_for(final)
    record = write_shard(staging, 0, {"x": 2})
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        commit(staging, final, [record], world_size=1, step=2)
    assert not staging.exists()  # a failed commit leaves no staging behind
    assert read_shard(final, 0) == {"x": 1}  # and the existing checkpoint is untouched


@pytest.mark.parametrize(
    "ranks, world_size, fragment",
    [([0, 0], 2, "distinct"), ([0, 2], 2, "within world_size"), ([0], 0, "world_size=0")],
)
def test_commit_rejects_inconsistent_records(tmp_path: Path, ranks: list[int], world_size: int, fragment: str) -> None:
    final = tmp_path / "checkpoint_x"
    staging = staging_dir_for(final)
    records = [write_shard(staging, r, {"r": r}) for r in ranks]
    with pytest.raises(CheckpointError, match=fragment):
        commit(staging, final, records, world_size=world_size)
    assert not final.exists() and not staging.exists()


def test_commit_detects_a_shard_changed_after_its_record(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_x"
    staging = staging_dir_for(final)
    record = write_shard(staging, 0, {"w": torch.ones(10)})
    write_shard(staging, 0, {"w": torch.ones(20)})  # a second save raced into the same staging
    with pytest.raises(CheckpointError, match="its rank reported"):
        commit(staging, final, [record], world_size=1)
    assert not final.exists()


def test_cleanup_staging_removes_only_staging_dirs(tmp_path: Path) -> None:
    _save_ranks(tmp_path / "checkpoint_1", {0: {"x": 1}}, 1, 1)
    write_shard(staging_dir_for(tmp_path / "checkpoint_2"), 0, {"x": 2})  # crashed before commit
    (tmp_path / "other").mkdir()
    removed = cleanup_staging(tmp_path)
    assert removed == [staging_dir_for(tmp_path / "checkpoint_2")]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1", "other"]
    assert cleanup_staging(tmp_path / "missing") == []
