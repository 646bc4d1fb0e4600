"""The memory tier's pure part: packed bytes equal the file written, a copy is decoded only
when it matches the manifest, and the registry serves only the committed checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayguard import checkpoint as ck
from rayguard.checkpoint.commit import commit
from rayguard.checkpoint.memory import (
    Snapshot,
    SnapshotRegistry,
    digests_of,
    load_snapshot,
    matches_manifest,
    pack_shard,
)
from rayguard.checkpoint.reader import read_shard, read_shard_bytes
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointCorruptError


def _payload():
    return {"state": {"w": torch.randn(300, 70), "b": torch.arange(5, dtype=torch.int16),
                      "half": torch.randn(3, 3).to(torch.bfloat16), "np": np.arange(7.0),
                      "step": 3, "name": "x", "t": (1, None, 2.5)},
            "__rayguard__": {"has_state": True}}


def _committed(tmp_path, payloads):
    staging = tmp_path / ".staging-c"
    records = [write_shard(staging, r, p) for r, p in enumerate(payloads)]
    final = commit(staging, tmp_path / "c", records, world_size=len(payloads), step=3)
    return final, records


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def test_pack_is_the_written_file_byte_for_byte(tmp_path):
    payload = _payload()
    final, records = _committed(tmp_path, [payload])
    files = pack_shard(0, payload)
    assert list(files) == [records[0].files[0].path]
    on_disk = (final / records[0].files[0].path).read_bytes()
    assert files[records[0].files[0].path].tobytes() == on_disk


def test_load_snapshot_decodes_a_matching_copy(tmp_path):
    payload = _payload()
    final, records = _committed(tmp_path, [payload])
    manifest = ck.read_manifest(final)
    files = pack_shard(0, payload)
    assert matches_manifest(digests_of(records[0]), manifest, 0)
    loaded = load_snapshot(files, manifest, 0, str(final))
    assert _equal(loaded, payload)
    assert _equal(loaded, read_shard(final, 0))
    # fresh memory: changing the copy afterwards does not change the state
    files[records[0].files[0].path][:] = 0
    assert _equal(loaded, payload)


def test_a_flipped_byte_a_missing_file_or_another_rank_is_refused(tmp_path):
    payload = _payload()
    final, _ = _committed(tmp_path, [payload, {"__rayguard__": {"has_state": False}}])
    manifest = ck.read_manifest(final)
    files = pack_shard(0, payload)
    name = next(iter(files))
    bad = {name: files[name].copy()}
    bad[name][len(bad[name]) - 3] ^= 1
    with pytest.raises(CheckpointCorruptError, match="blake3 mismatch"):
        load_snapshot(bad, manifest, 0, str(final))
    with pytest.raises(CheckpointCorruptError, match="memory copy of rank 0"):
        load_snapshot({}, manifest, 0, str(final))
    with pytest.raises(CheckpointCorruptError, match="memory copy of rank 1"):
        load_snapshot(files, manifest, 1, str(final))  # rank 0's bytes offered as rank 1's
    assert not matches_manifest({name: "0" * 64}, manifest, 0)


def test_read_shard_bytes_checks_size_and_header(tmp_path):
    payload = _payload()
    final, records = _committed(tmp_path, [payload])
    record = records[0].files[0]
    data = next(iter(pack_shard(0, payload).values()))
    with pytest.raises(CheckpointCorruptError, match="size is"):
        read_shard_bytes(data[:-1], record, "x")
    with pytest.raises(CheckpointCorruptError, match="header length"):
        read_shard_bytes(np.full(16, 255, np.uint8), None, "x")
    assert _equal(read_shard_bytes(data.tobytes(), None, "x"), payload)


def _snap(path, step, rank, ref="r"):
    return Snapshot(path, step, rank, "node", {}, ref)


def test_registry_serves_only_the_committed_checkpoint_and_bounds_each_rank():
    reg = SnapshotRegistry()
    assert reg.offer(_snap("c1", 1, 0)) == [] and reg.offer(_snap("c1", 1, 1)) == []
    assert reg.lookup("c1", 0) is None  # not committed yet
    assert reg.commit("c1", 1) == []
    assert reg.lookup("c1", 0).path == "c1" and reg.lookup("c1", 1) is not None
    reg.offer(_snap("c2", 2, 0))  # a save in progress: c1 still served
    assert reg.lookup("c1", 0) is not None and reg.lookup("c2", 0) is None
    dropped = reg.offer(_snap("c3", 3, 0))  # c2 never committed (failed): replaced
    assert [s.path for s in dropped] == ["c2"]
    assert sorted(s.path for s in reg.held() if s.rank == 0) == ["c1", "c3"]
    dropped = reg.commit("c3", 3)
    assert sorted((s.path, s.rank) for s in dropped) == [("c1", 0), ("c1", 1)]
    assert reg.lookup("c1", 1) is None and reg.lookup("c3", 1) is None  # rank 1 never offered
    assert [s.path for s in reg.held()] == ["c3"]


def test_registry_accepts_a_late_offer_of_the_committed_one_and_refuses_older():
    reg = SnapshotRegistry()
    reg.commit("c5", 5)
    assert reg.offer(_snap("c5", 5, 1)) == []  # arrived after the commit: still servable
    assert reg.lookup("c5", 1) is not None
    stale = _snap("c4", 4, 0)
    assert reg.offer(stale) == [stale] and reg.lookup("c4", 0) is None
    again = _snap("c5", 5, 1, ref="new")
    assert reg.offer(again)[0].refs == "r" and reg.lookup("c5", 1).refs == "new"
