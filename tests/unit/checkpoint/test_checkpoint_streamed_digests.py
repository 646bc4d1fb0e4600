"""Digests computed while bytes are written equal the ones a re-read computes: the
incremental hasher across arbitrary write boundaries, and DCP's data files written through
:class:`~rayguard.checkpoint.dcp_writer.HashingWriter` and recorded without a re-read."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import file_digests, hashing
from rayguard.checkpoint import sharded as sh
from rayguard.testing.forge import flip_byte


@pytest.mark.parametrize("threads", [0, 3])
def test_write_hasher_matches_the_reference_across_write_boundaries(threads, monkeypatch):
    monkeypatch.setattr(hashing, "INLINE_BYTES", 8)
    data = random.Random(1).randbytes(10_000)
    rng = random.Random(2)
    pool = ThreadPoolExecutor(threads) if threads else None
    try:
        hasher = hashing.WriteHasher(pool, chunk_size=1000)
        out = bytearray()
        pos = 0
        while pos < len(data):
            n = rng.choice([0, 1, 7, 999, 1000, 1001, 2500])
            piece = memoryview(data)[pos : pos + n]
            assert hasher.around(piece, lambda p=piece: out.extend(p) or p.nbytes) == piece.nbytes
            pos += n
    finally:
        if pool:
            pool.shutdown()
    assert bytes(out) == data
    assert hasher.finish() == hashing.digest_bytes(data, chunk_size=1000)
    assert hasher.nbytes == len(data)


def test_write_hasher_of_nothing_is_the_empty_digest():
    assert hashing.WriteHasher(None).finish() == hashing.digest_bytes(b"")


def _dcp_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(3_000_000, generator=g), "b": torch.randn(7, generator=g).bfloat16(),
            "step": 12, "nested": {"m": torch.arange(1000), "lr": [0.1, 0.2]}}


def test_hashing_writer_digests_equal_a_reread(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    from rayguard.checkpoint.dcp_writer import HashingWriter

    writer = HashingWriter(tmp_path / "dcp", sync_files=False, threads=2)
    dcp.save(_dcp_state(), storage_writer=writer, no_dist=True)
    data_files = sorted(n for n in os.listdir(tmp_path / "dcp") if n.endswith(".distcp"))
    assert sorted(writer.digests) == data_files and data_files
    reread = file_digests.hash_files([tmp_path / "dcp" / n for n in data_files])
    for name, again in zip(data_files, reread, strict=True):
        size, digest, chunks = writer.digests[name]
        assert size == os.path.getsize(tmp_path / "dcp" / name)
        assert (digest, chunks) == again
    streamed = sh.record_dcp_files(tmp_path, 0, digests=writer.digests)
    assert streamed == sh.record_dcp_files(tmp_path, 0)  # the re-read's records, same content
    assert [r.path for r in streamed] == ["dcp/.metadata"] + [f"dcp/{n}" for n in data_files]


def test_a_streamed_digest_of_another_size_is_not_trusted(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    from rayguard.checkpoint.dcp_writer import HashingWriter

    writer = HashingWriter(tmp_path / "dcp", sync_files=False)
    dcp.save(_dcp_state(), storage_writer=writer, no_dist=True)
    (name, (size, digest, chunks)), = writer.digests.items()
    with open(tmp_path / "dcp" / name, "ab") as f:
        f.write(b"appended after the write")
    (record,) = [r for r in sh.record_dcp_files(tmp_path, 0, digests=writer.digests)
                 if r.path == f"dcp/{name}"]
    assert record.size_bytes == size + 24 and record.digest != digest


def _streamed_checkpoint(root: Path, step: int) -> Path:
    """A committed checkpoint whose DCP records come from the digests taken while writing."""
    import torch.distributed.checkpoint as dcp

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.commit import commit, staging_dir_for
    from rayguard.checkpoint.dcp_writer import HashingWriter
    from rayguard.checkpoint.writer import write_shard

    final = root / f"checkpoint_{step:09d}_a0"
    staging = staging_dir_for(final)
    state = {"model": {"w": torch.full((300_000,), float(step))}, "extra": {"n": step}}
    writer = HashingWriter(staging / sh.DCP_DIR, sync_files=False)
    dcp.save(state, storage_writer=writer, no_dist=True)
    plain = write_shard(staging, 0, {"step": step})
    record = ck.ShardRecord(0, plain.files + sh.record_dcp_files(staging, 0, digests=writer.digests))
    meta = {sh.SHARDED_KEY: sh.describe_sharded(1, [], ["model", "extra"])}
    return commit(staging, final, [record], world_size=1, step=step, metadata=meta)


def _load(path: Path) -> dict:
    from rayguard.train import sharded as adapter

    state = {"model": {"w": torch.zeros(300_000)}, "extra": {"n": -1}}
    adapter.load(str(path), state)
    return state


def test_a_corrupted_streamed_dcp_file_is_rejected_and_the_older_one_loaded(tmp_path: Path):
    from rayguard import checkpoint as ck

    old, new = _streamed_checkpoint(tmp_path, 1), _streamed_checkpoint(tmp_path, 2)
    assert ck.verify(new).ok
    data = new / sh.DCP_DIR / "__0_0.distcp"
    flip_byte(data, mask=0x01)
    report = ck.verify(new)
    assert [p.file for p in report.problems] == ["dcp/__0_0.distcp"]
    assert "blake3 mismatch" in report.problems[0].what
    found = ck.scan(tmp_path)
    assert found.chosen == old and [r.path for r in found.rejected] == [str(new)]
    state = _load(found.chosen)
    assert state["extra"]["n"] == 1 and bool((state["model"]["w"] == 1.0).all())


def test_a_forged_metadata_beside_streamed_digests_never_runs_code(tmp_path: Path):
    from rayguard import checkpoint as ck
    from rayguard.exceptions import CheckpointCorruptError
    from rayguard.testing.forge import command_pickle, forge_file

    old, new = _streamed_checkpoint(tmp_path, 1), _streamed_checkpoint(tmp_path, 2)
    marker = tmp_path / "pwned"
    forge_file(new, "dcp/.metadata", command_pickle(f"touch {marker}"))  # manifest rewritten
    report = ck.verify(new)
    assert [p.file for p in report.problems] == ["dcp/.metadata"]
    assert "refusing to unpickle posix.system" in report.problems[0].what
    assert ck.find_latest_valid(tmp_path)[0] == old
    with pytest.raises(CheckpointCorruptError, match="refusing to unpickle posix.system"):
        _load(new)
    assert not marker.exists()
    assert _load(old)["extra"]["n"] == 1
