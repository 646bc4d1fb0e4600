"""Sharded loads verify the bytes DCP reads as it reads them: the segment planner, the
verifying reader (a corrupt chunk is refused before anything in it reaches the state), and
load_state(sharded=...) falling back to an older checkpoint through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import dcp_verified_read as vr
from rayguard.checkpoint import read_manifest
from rayguard.checkpoint import sharded as sh
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.schemes import CHUNK_SIZE_BYTES as C
from rayguard.exceptions import CheckpointError
from rayguard.testing.collective import ThreadGroup
from rayguard.testing.forge import flip_byte
from rayguard.train import checkpointing, protocol
from rayguard.train import sharded as adapter
from rayguard.train.store import LocalStore

N = 6 * 1024 * 1024  # float32 elements: 24 MiB, two chunks
SENTINEL = -7.0


# -- the planner ---------------------------------------------------------------------------
def test_segments_cover_each_range_once_in_file_order_and_skip_untouched_chunks() -> None:
    ranges = [(5 * C + 10, 100), (0, 10), (C - 5, 10), (20, 30)]
    segs = vr.plan_segments(ranges, chunk_size=C, max_bytes=8 * C)
    assert sorted(i for s in segs for i in s.items) == [0, 1, 2, 3]
    assert [(s.first, s.end) for s in segs] == [(0, 2), (5, 6)]  # chunks 2..4 never read
    assert segs[0].items == (1, 3, 2)  # by offset


def test_segments_stay_within_the_cap_unless_one_range_is_larger() -> None:
    ranges = [(i * 10, 10) for i in range(40)]  # 400 bytes in 10-byte chunks
    segs = vr.plan_segments(ranges, chunk_size=10, max_bytes=100)
    assert all(s.end - s.first <= 10 for s in segs) and len(segs) == 4
    big = vr.plan_segments([(5, 1000), (1005, 3)], chunk_size=10, max_bytes=100)
    assert [(s.first, s.end, s.items) for s in big] == [(0, 101, (0, 1))]
    for s in vr.plan_segments([(0, 95), (95, 10), (105, 90)], chunk_size=10, max_bytes=100):
        assert s.end - s.first <= 10 or len(s.items) == 1


def test_ranges_sharing_a_chunk_across_a_cap_reread_only_that_chunk() -> None:
    segs = vr.plan_segments([(0, 95), (95, 10)], chunk_size=10, max_bytes=100)
    assert [(s.first, s.end) for s in segs] == [(0, 10), (9, 11)]


# -- real DCP checkpoints --------------------------------------------------------------------
def _checkpoint(root: Path, step: int) -> Path:
    """A committed sharded checkpoint of world size 1: ``a`` (24 MiB) and ``b`` (24 MiB)."""
    import torch.distributed.checkpoint as dcp

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.commit import commit, staging_dir_for
    from rayguard.checkpoint.dcp_writer import HashingWriter
    from rayguard.checkpoint.rng import capture_rng_state
    from rayguard.checkpoint.writer import write_shard

    final = root / f"checkpoint_{step:09d}_a0"
    staging = staging_dir_for(final)
    state = {"model": {"a": torch.full((N,), float(step)), "b": torch.full((N,), float(step) + 0.5)},
             "extra": {"n": step}}
    writer = HashingWriter(staging / sh.DCP_DIR, sync_files=False)
    dcp.save(state, storage_writer=writer, no_dist=True)
    plain = write_shard(staging, 0, protocol.make_payload({"step": step}, capture_rng_state()))
    record = ck.ShardRecord(0, plain.files + sh.record_dcp_files(staging, 0, digests=writer.digests))
    meta = {sh.SHARDED_KEY: sh.describe_sharded(1, [], ["model", "extra"])}
    return commit(staging, final, [record], world_size=1, step=step, metadata=meta)


def _target() -> dict:
    return {"model": {"a": torch.full((N,), SENTINEL), "b": torch.full((N,), SENTINEL)},
            "extra": {"n": -1}}


def _load_verified(ckpt: Path, target: dict) -> tuple:
    group = ThreadGroup(1)
    [out] = group.run(lambda c: adapter.load_verified(c, str(ckpt), target, read_manifest(ckpt),
                                                      "t"))
    if isinstance(out, BaseException):
        raise out
    return out[0]


@pytest.mark.parametrize("segment_bytes", [vr.SEGMENT_BYTES, C])
def test_a_good_checkpoint_loads_with_every_read_byte_verified(tmp_path: Path, monkeypatch,
                                                              segment_bytes: int) -> None:
    monkeypatch.setattr(vr, "SEGMENT_BYTES", segment_bytes)
    ckpt = _checkpoint(tmp_path, 3)
    target = _target()
    assert _load_verified(ckpt, target) == ()
    assert bool((target["model"]["a"] == 3.0).all()) and bool((target["model"]["b"] == 3.5).all())
    assert target["extra"]["n"] == 3


def test_a_load_of_many_segments_reads_them_all_into_two_buffers(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """One chunk per segment: the 48 MiB file is several segments, all read into the same
    two buffers (one served while the next is read), and every value arrives."""
    from rayguard.checkpoint import readbuf

    fresh: list[int] = []
    served: list[int] = []

    def counting(nbytes: int) -> memoryview:
        fresh.append(nbytes)
        return readbuf.read_buffer(nbytes)

    serve = vr.VerifyingReader._serve

    def counting_serve(self, file, entry, *args) -> None:  # type: ignore[no-untyped-def]
        served.append(entry[0].first)
        serve(self, file, entry, *args)

    monkeypatch.setattr(vr, "SEGMENT_BYTES", C)
    monkeypatch.setattr(vr, "read_buffer", counting)
    monkeypatch.setattr(vr.VerifyingReader, "_serve", counting_serve)
    ckpt = _checkpoint(tmp_path, 4)
    target = _target()
    assert _load_verified(ckpt, target) == ()
    assert len(served) >= 3 and len(fresh) == 2
    assert bool((target["model"]["a"] == 4.0).all()) and bool((target["model"]["b"] == 4.5).all())


def test_a_corrupt_chunk_is_refused_before_anything_in_it_reaches_the_state(tmp_path: Path) -> None:
    """A byte flipped in the data file's last chunk (inside ``b``): ``b``'s target keeps its
    values, the problem names the file, the byte range and the scheme."""
    ckpt = _checkpoint(tmp_path, 3)
    data = ckpt / sh.DCP_DIR / "__0_0.distcp"
    size = data.stat().st_size
    flip_byte(data, -4096, mask=0x01)
    target = _target()
    [problem] = _load_verified(ckpt, target)
    last = (size - 1) // C
    assert problem.file == "dcp/__0_0.distcp"
    assert f"blake3 mismatch in bytes [{last * C}, {size})" in problem.what
    assert "nothing of that chunk was used" in problem.what
    assert bool((target["model"]["b"] == SENTINEL).all())  # never copied into the state


def test_a_manifest_whose_chunk_digests_do_not_add_up_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 3)
    doc = json.loads((ckpt / MANIFEST_NAME).read_text(encoding="utf-8"))
    entry = next(f for f in doc["files"] if f["path"] == "dcp/__0_0.distcp")
    entry["chunk_digests"][0] = "00" * 32  # the chunk list no longer matches the file digest
    (ckpt / MANIFEST_NAME).write_text(json.dumps(doc), encoding="utf-8")
    target = _target()
    [problem] = _load_verified(ckpt, target)
    assert problem.file == "dcp/__0_0.distcp" and "do not add up" in problem.what
    assert bool((target["model"]["a"] == SENTINEL).all())


def _load_state(root: Path, target: dict) -> object:
    group = ThreadGroup(1)
    [out] = group.run(lambda c: checkpointing.load_state(c, LocalStore(str(root)), target,
                                                         load_count=1, previous_rank=None))
    return out


def test_load_state_rejects_a_checkpoint_corrupt_on_read_and_loads_the_older_one(tmp_path: Path) -> None:
    old, new = _checkpoint(tmp_path, 1), _checkpoint(tmp_path, 2)
    flip_byte(new / sh.DCP_DIR / "__0_0.distcp", mask=0x01)
    assert [p.file for p in sh.verify_share(new, 0, 1, dcp_data=False).problems] == []
    target = _target()
    restored = _load_state(tmp_path, target)
    assert isinstance(restored, protocol.Restored), restored
    assert restored.path == str(old) and restored.state == {"step": 1}
    assert bool((target["model"]["a"] == 1.0).all()) and bool((target["model"]["b"] == 1.5).all())
    assert target["extra"]["n"] == 1
    from rayguard.checkpoint import rejections

    assert "blake3 mismatch" in rejections.rejected(str(tmp_path))[str(new)]


def test_load_state_fails_the_attempt_when_no_checkpoint_is_left_after_a_partial_load(
        tmp_path: Path, monkeypatch) -> None:
    """One segment per chunk: ``a`` is loaded before the bad chunk under ``b`` is found."""
    monkeypatch.setattr(vr, "SEGMENT_BYTES", C)
    only = _checkpoint(tmp_path, 1)
    flip_byte(only / sh.DCP_DIR / "__0_0.distcp", -10, mask=0x01)
    target = _target()
    out = _load_state(tmp_path, target)
    assert isinstance(out, CheckpointError) and "partly loaded from" in str(out)
    assert bool((target["model"]["a"] == 1.0).all()) and bool((target["model"]["b"] == SENTINEL).all())
    assert _load_state(tmp_path, _target()) is None  # the next attempt: a fresh start


def test_a_rejection_that_used_nothing_leaves_a_fresh_start(tmp_path: Path) -> None:
    """The bad chunk is the first one, in the first segment: found before any item is used, so
    with no older checkpoint the load is a fresh start, as when the check came first."""
    only = _checkpoint(tmp_path, 1)
    flip_byte(only / sh.DCP_DIR / "__0_0.distcp", 100, mask=0x01)
    target = _target()
    assert _load_state(tmp_path, target) is None
    assert bool((target["model"]["a"] == SENTINEL).all())
