"""Run directories that come from elsewhere, from the attacker's side: files forged with their
manifest entries rewritten to match, links planted where rayguard writes, and crafted bytes
that must be rejected (and fall back to an older checkpoint) rather than crash or run code."""

from __future__ import annotations

import io
import json
import os
import pickle
import tracemalloc
from pathlib import Path

import pytest
import torch

from rayguard import checkpoint as ck
from rayguard.checkpoint import file_digests, hashing, rejections
from rayguard.checkpoint import sharded as sh
from rayguard.checkpoint.commit import commit, staging_dir_for
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.reader import read_shard
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointCorruptError, CheckpointError
from rayguard.testing.forge import RunsCommand, command_pickle, forge_file

SHARD = "shard-rank00000.safetensors"


def _dcp_checkpoint(root: Path, step: int) -> Path:
    """A committed checkpoint with a DCP part (one process) holding tensors and a non-tensor
    value (``extra.n``, which DCP stores as a pickled object)."""
    import torch.distributed.checkpoint as dcp

    final = root / f"checkpoint_{step:09d}_a0"
    staging = staging_dir_for(final)
    state = {"model": {"w": torch.full((300,), float(step))}, "extra": {"n": step}}
    dcp.save(state, checkpoint_id=str(staging / sh.DCP_DIR), no_dist=True)
    plain = write_shard(staging, 0, {"step": step})
    record = ck.ShardRecord(0, plain.files + sh.record_dcp_files(staging, 0))
    meta = {sh.SHARDED_KEY: sh.describe_sharded(1, [], ["model", "extra"])}
    return commit(staging, final, [record], world_size=1, step=step, metadata=meta)


def _load_dcp(path: Path) -> dict:
    from rayguard.train import sharded as adapter

    state = {"model": {"w": torch.zeros(300)}, "extra": {"n": -1}}
    adapter.load(str(path), state)
    return state


# -- 1. no code runs from a sharded checkpoint -------------------------------------------

def test_forged_dcp_metadata_is_invalid_and_the_older_checkpoint_is_chosen(tmp_path):
    old, new = _dcp_checkpoint(tmp_path, 1), _dcp_checkpoint(tmp_path, 2)
    marker = tmp_path / "pwned"
    forge_file(new, "dcp/.metadata", command_pickle(f"touch {marker}"))
    report = ck.verify(new)
    assert not report.ok and [p.file for p in report.problems] == ["dcp/.metadata"]
    assert "refusing to unpickle posix.system" in report.problems[0].what
    assert ck.find_latest_valid(tmp_path)[0] == old
    with pytest.raises(CheckpointCorruptError, match="refusing to unpickle posix.system"):
        _load_dcp(new)
    assert not marker.exists()
    assert _load_dcp(old)["extra"]["n"] == 1


def test_rank_local_metadata_outside_the_manifest_is_never_read(tmp_path):
    path = _dcp_checkpoint(tmp_path, 1)
    marker = tmp_path / "pwned"
    forge_file(path, "dcp/.metadata", b"not a pickle")  # the global one fails to load...
    (path / "dcp" / "__0.metadata").write_bytes(command_pickle(f"touch {marker}"))  # ...DCP's fallback
    with pytest.raises(CheckpointError):
        _load_dcp(path)
    assert not marker.exists()


def test_non_tensor_value_that_runs_code_is_invalid(tmp_path):
    from torch.distributed.checkpoint import filesystem as dcp_fs

    old, new = _dcp_checkpoint(tmp_path, 1), _dcp_checkpoint(tmp_path, 2)
    marker = tmp_path / "pwned"
    data_file = new / "dcp" / "__0_0.distcp"
    data = data_file.read_bytes()
    evil = io.BytesIO()
    torch.save(RunsCommand(f"touch {marker}"), evil)
    md = pickle.loads((new / "dcp" / ".metadata").read_bytes())  # our own file: trusted here
    for key in md.storage_data:
        if key.fqn == "extra.n":
            md.storage_data[key] = dcp_fs._StorageInfo("__0_0.distcp", len(data), len(evil.getvalue()))
    forge_file(new, "dcp/__0_0.distcp", data + evil.getvalue())
    forge_file(new, "dcp/.metadata", pickle.dumps(md))
    report = ck.verify(new)
    assert [p.file for p in report.problems] == ["dcp/__0_0.distcp"]
    assert "'extra.n' cannot be loaded without running code" in report.problems[0].what
    assert ck.find_latest_valid(tmp_path)[0] == old
    with pytest.raises(CheckpointError):
        _load_dcp(new)
    assert not marker.exists()


def test_metadata_pointing_outside_the_manifest_is_invalid(tmp_path):
    from torch.distributed.checkpoint import filesystem as dcp_fs

    path = _dcp_checkpoint(tmp_path, 1)
    md = pickle.loads((path / "dcp" / ".metadata").read_bytes())
    key = next(iter(md.storage_data))
    md.storage_data[key] = dcp_fs._StorageInfo("../../../etc/passwd", 0, 10)
    forge_file(path, "dcp/.metadata", pickle.dumps(md))
    report = ck.verify(path)
    assert "not a DCP data file of this checkpoint's manifest" in report.problems[0].what


# -- 2. no write follows a planted link ----------------------------------------------------

def test_rejection_record_never_writes_through_planted_links(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    root = tmp_path / "run"
    root.mkdir()
    (root / "rayguard_rejected.tmp").symlink_to(victim)
    (root / "rayguard_rejected.json.lock").symlink_to(tmp_path / "victim.txt")
    with pytest.raises(OSError):  # the lock file is opened O_NOFOLLOW
        rejections.reject(root / "checkpoint_000001", "bad")
    (root / "rayguard_rejected.json.lock").unlink()
    rejections.reject(root / "checkpoint_000001", "bad")
    assert victim.read_text() == "precious"
    assert rejections.rejected(root) == {str(root / "checkpoint_000001"): "bad"}


def test_planted_staging_link_is_refused(tmp_path):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    root = tmp_path / "run"
    root.mkdir()
    final = root / "checkpoint_000002"
    staging_dir_for(final).symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="is a symlink; refusing to write through it"):
        ck.save(final, {"w": torch.ones(3)}, step=2)
    assert list(elsewhere.iterdir()) == [] and not final.is_symlink()


def test_planted_shard_link_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / SHARD).symlink_to(victim)
    write_shard(staging, 0, {"w": torch.ones(3)})
    assert victim.read_text() == "precious" and not (staging / SHARD).is_symlink()


# -- 3. a crafted file is skipped, never a crash -------------------------------------------

def _two_checkpoints(root: Path) -> tuple[Path, Path]:
    old = ck.save(root / "checkpoint_000001", {"w": torch.ones(10), "step": 1}, step=1)
    new = ck.save(root / "checkpoint_000002", {"w": torch.ones(10) * 2, "step": 2}, step=2)
    return old, new


def _edit_manifest(path: Path, old: str, new: str) -> None:
    text = (path / MANIFEST_NAME).read_text()
    assert old in text
    (path / MANIFEST_NAME).write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("old, new", [
    ('"step": 2', '"step": 1e999'),
    ('"world_size": 1', '"world_size": 1e999'),
    ('"created_unix": ', '"created_unix": 1e999, "x": '),
    ('"files": [', '"files": ' + "[" * 100_000 + "]" * 99_999 + ", ["),
])
def test_crafted_manifest_is_skipped(tmp_path, old, new):
    older, newer = _two_checkpoints(tmp_path)
    _edit_manifest(newer, old, new)
    report = ck.verify(newer)
    assert not report.ok and report.problems[0].file == MANIFEST_NAME
    assert ck.find_latest_valid(tmp_path)[0] == older
    assert ck.load_latest_valid(tmp_path, 0).state["step"] == 1


def _forge_header(path: Path, edit) -> None:
    data = (path / SHARD).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header["__metadata__"]
    meta["rayguard.structure"] = edit(meta["rayguard.structure"])
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    forge_file(path, SHARD, len(raw).to_bytes(8, "little") + raw + data[8 + n :])


@pytest.mark.parametrize("edit", [
    lambda s: s.replace('"shape":[10]', '"shape":[1e999]'),
    lambda s: s.replace('"shape":[10]', '"shape":[4611686018427387904,4611686018427387904]'),
    lambda s: s.replace('"i":0', '"i":1e999'),
    lambda s: '{"_":"list","v":' * 500 + s + "}" * 500,
])
def test_crafted_shard_header_is_skipped(tmp_path, edit):
    older, newer = _two_checkpoints(tmp_path)
    _forge_header(newer, edit)
    with pytest.raises(CheckpointCorruptError):
        read_shard(newer, 0)
    assert ck.load_latest_valid(tmp_path, 0).state["step"] == 1


@pytest.mark.parametrize("content", ["[1, 2]", "1e999", "[" * 100_000, "\xff", '{"a": {"b": 1}}'])
def test_crafted_rejection_file_rejects_nothing(tmp_path, content):
    (tmp_path / rejections.REJECTIONS_FILENAME).write_bytes(content.encode("utf-8", "surrogateescape"))
    assert rejections.rejected(tmp_path) == {}
    rejections.reject(tmp_path / "checkpoint_000001", "bad")
    assert rejections.rejected(tmp_path) == {str(tmp_path / "checkpoint_000001"): "bad"}


# -- 4. a shard header is compared with the manifest before it is parsed ------------------

def test_forged_header_is_not_parsed(tmp_path):
    path = ck.save(tmp_path / "checkpoint_000001", {"s": "a" * 4_000_000, "w": torch.ones(4)}, step=1)
    data = bytearray((path / SHARD).read_bytes())
    n = int.from_bytes(data[:8], "little")
    garbage = b'{"x":[' + b"{}," * ((n - 10) // 3) + b"{}]}"
    data[8 : 8 + n] = garbage + b" " * (n - len(garbage))  # same size: only the digest differs
    (path / SHARD).write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointCorruptError, match="holding the shard header \\(not parsed\\)"):
            read_shard(path, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * n  # parsing it would build ~1.3 million dicts (over 20 times n)


# -- 7. the hash pool holds a bounded number of chunks ---------------------------------------

def test_hash_files_keeps_a_bounded_number_of_chunks_in_flight(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(64 * 100_000))
    tracemalloc.start()
    try:
        (digest, chunks), = file_digests.hash_files([path], threads=2, chunk_size=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(chunks) == 100_000
    assert digest == hashing.combine([bytes.fromhex(c) for c in chunks])
    assert peak < 20_000_000  # one future per chunk up front is ~100 MB here
