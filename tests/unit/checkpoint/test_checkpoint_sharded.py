"""The sharded part of a checkpoint without Ray: the pure rules (which rank owns which DCP
file, completeness, the manifest entry, DTensor detection), and real DCP files committed
under a rayguard manifest, corrupted one way at a time, rejected, with fallback."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import torch

from rayguard import checkpoint as ck
from rayguard.checkpoint import sharded as sh
from rayguard.checkpoint.commit import commit, staging_dir_for
from rayguard.checkpoint.manifest import FileRecord, Manifest
from rayguard.checkpoint.reader import read_shard
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointError, SerializationError
from rayguard.testing.forge import flip_byte


def test_owner_of_dcp_files():
    assert sh.owner_of(".metadata") == 0
    assert sh.owner_of("__3_0.distcp") == 3
    assert sh.owner_of("__12_7.distcp") == 12
    for stranger in ("__x_0.distcp", "notes.txt", "__1_0.distcp.tmp", ".metadata.tmp"):
        assert sh.owner_of(stranger) is None
    names = [".metadata", "__0_0.distcp", "__1_0.distcp", "__1_1.distcp", "junk"]
    assert sh.files_of_rank(names, 0) == [".metadata", "__0_0.distcp"]
    assert sh.files_of_rank(names, 1) == ["__1_0.distcp", "__1_1.distcp"]
    assert sh.unclaimed(names, 2) == ["junk"]
    assert sh.unclaimed(names, 1) == ["__1_0.distcp", "__1_1.distcp", "junk"]


def _rec(name: str, rank: int) -> FileRecord:
    return FileRecord(f"dcp/{name}", rank, 1, "d")


def test_check_complete():
    listing = [".metadata", "__0_0.distcp", "__1_0.distcp"]
    records = [_rec(".metadata", 0), _rec("__0_0.distcp", 0), _rec("__1_0.distcp", 1)]
    sh.check_complete(records, listing, 2)
    with pytest.raises(CheckpointError, match=r"written but not hashed \['__1_0.distcp'\]"):
        sh.check_complete(records[:2], listing, 2)
    with pytest.raises(CheckpointError, match="files no rank wrote"):
        sh.check_complete(records, [*listing, "extra.bin"], 2)
    with pytest.raises(CheckpointError, match=r"no \.metadata"):
        sh.check_complete(records[1:], listing[1:], 2)


def test_describe_and_check_loadable():
    mesh = {"device_type": "cpu", "shape": [2], "dim_names": [], "placements": ["Shard(dim=0)"]}
    info = sh.describe_sharded(2, [mesh, dict(mesh)], ["optim", "model"])
    assert info == {"format": sh.SHARDED_FORMAT, "dir": "dcp", "world_size": 2,
                    "meshes": [mesh], "keys": ["model", "optim"]}
    files = (FileRecord("shard-rank00000.safetensors", 0, 1, "d"), _rec(".metadata", 0))
    m = Manifest(world_size=2, step=1, files=files, metadata={sh.SHARDED_KEY: info})
    assert sh.check_loadable(m, "ck") is info
    assert m.shard_files_of(0) == files[:1]
    with pytest.raises(CheckpointError, match="holds no sharded state"):
        sh.check_loadable(Manifest(world_size=2, step=1, files=files), "ck")
    bare = Manifest(world_size=2, step=1, files=files[:1], metadata={sh.SHARDED_KEY: info})
    with pytest.raises(CheckpointError, match="lists no dcp/.metadata"):
        sh.check_loadable(bare, "ck")


def _dcp_checkpoint(root: Path, step: int, value: float) -> Path:
    """A committed checkpoint holding a DCP part (one process, no_dist) and a plain shard."""
    import torch.distributed.checkpoint as dcp

    final = root / f"checkpoint_{step:09d}_a0"
    staging = staging_dir_for(final)
    state = {"model": {"w": torch.full((3000,), value), "b": torch.arange(7.0)}}
    dcp.save(state, checkpoint_id=str(staging / sh.DCP_DIR), no_dist=True)
    plain = write_shard(staging, 0, {"step": step})
    record = ck.ShardRecord(0, plain.files + sh.record_dcp_files(staging, 0))
    dcp_records = [f for f in record.files if f.path.startswith("dcp/")]
    sh.check_complete(dcp_records, os.listdir(staging / sh.DCP_DIR), 1)
    meta = {sh.SHARDED_KEY: sh.describe_sharded(1, [], ["model"])}
    return commit(staging, final, [record], world_size=1, step=step, metadata=meta)


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)


@pytest.mark.parametrize("damage, file, what", [
    (partial(flip_byte, mask=0x01), "__0_0.distcp", "blake3 mismatch"),
    (Path.unlink, ".metadata", "missing"),
    (_truncate, "__0_0.distcp", "size is"),
    (partial(flip_byte, mask=0x01), ".metadata", "blake3 mismatch"),
])
def test_damaged_dcp_file_is_rejected_and_the_older_one_chosen(tmp_path, damage, file, what):
    old = _dcp_checkpoint(tmp_path, 1, 1.0)
    new = _dcp_checkpoint(tmp_path, 2, 2.0)
    manifest = ck.read_manifest(new)
    assert {f.path for f in manifest.files} == {
        "shard-rank00000.safetensors", "dcp/.metadata", "dcp/__0_0.distcp"}
    assert ck.verify(new).ok
    damage(new / sh.DCP_DIR / file)
    report = ck.verify(new)
    assert [p.file for p in report.problems] == [f"dcp/{file}"]
    assert what in report.problems[0].what
    found = ck.scan(tmp_path)
    assert found.chosen == old
    assert [r.path for r in found.rejected] == [str(new)]


def test_plain_shard_reads_beside_the_dcp_files(tmp_path):
    path = _dcp_checkpoint(tmp_path, 3, 0.5)
    assert read_shard(path, 0) == {"step": 3}


# -- with a real (single-process) gloo group: DTensors and the DCP adapter -----------------

@pytest.fixture(scope="module")
def group(tmp_path_factory):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _fsdp_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    return model


def test_dtensor_found_in_plain_state_and_refused_by_the_format(group):
    model = _fsdp_model()
    state = {"model": model.state_dict(), "step": 3, "extra": [torch.zeros(2)]}
    paths = sh.find_distributed_tensors(state)
    assert paths == ["state['model']['0.weight']", "state['model']['0.bias']",
                     "state['model']['1.weight']", "state['model']['1.bias']"]
    assert sh.find_distributed_tensors({"model": {"w": torch.zeros(1)}}) == []
    message = sh.dtensor_error_message(paths[:1], 1)
    assert "rank 1" in message and "sharded={'model': model, 'optim': opt}" in message
    with pytest.raises(SerializationError, match=r"is a DTensor.*sharded="):
        write_shard(Path("/nonexistent-never-written"), 0, state)


def test_a_dtensor_in_report_state_ends_the_run_naming_sharded(group):
    """What ``report(state=)`` checks before any peer waits (``check_checkpointable``): a
    DTensor there is refused with the path and the ``sharded=`` fix, as an error that is
    never retried (the end-to-end run of such an error, its ``Fix:`` in ``fit()``'s error and
    no second attempt: tests/ray/test_crash_loop.py's unsaveable state)."""
    from rayguard.checkpoint.checkpointable import check_checkpointable
    from rayguard.exceptions import StateNotCheckpointableError
    from rayguard.failures import classify

    model = _fsdp_model()
    check_checkpointable({"step": 1, "w": torch.zeros(2)}, 1)  # plain values pass
    with pytest.raises(StateNotCheckpointableError,
                       match=r"rank 1: state\['model'\]\['0\.weight'\].* is a DTensor") as info:
        check_checkpointable({"model": model.state_dict(), "step": 1}, 1)
    assert "sharded={'model': model, 'optim': opt}" in str(info.value)
    assert classify(info.value).fatal


def test_check_sharded_arg(group):
    from rayguard.train.sharded import check_sharded_arg

    model = _fsdp_model()
    opt = torch.optim.AdamW(model.parameters())
    assert check_sharded_arg({"model": model, "optim": opt}) is None
    assert check_sharded_arg({"model": model}) is None
    assert "non-empty dict" in check_sharded_arg({})
    assert "non-empty dict" in check_sharded_arg(model)
    assert "keys must be strings" in check_sharded_arg({1: model})
    assert "exactly one module" in check_sharded_arg({"optim": opt})
    assert "exactly one module" in check_sharded_arg({"a": model, "b": _fsdp_model(), "o": opt})


def test_adapter_roundtrip_in_place(group, tmp_path):
    from rayguard.train import sharded as adapter

    model = _fsdp_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    meshes = adapter.save(str(tmp_path), {"model": model, "optim": opt})
    assert meshes[0]["device_type"] == "cpu" and meshes[0]["shape"] == [1]
    saved = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    saved_opt = {k: v["exp_avg"].full_tensor().clone() for k, v in opt.state_dict()["state"].items()}
    other = _fsdp_model()
    for p in other.parameters():
        torch.nn.init.zeros_(p)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    adapter.load(str(tmp_path), {"model": other, "optim": other_opt})
    loaded = {k: v.full_tensor() for k, v in other.state_dict().items()}
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    loaded_opt = {k: v["exp_avg"].full_tensor() for k, v in other_opt.state_dict()["state"].items()}
    assert all(torch.equal(saved_opt[k], loaded_opt[k]) for k in saved_opt)
    with pytest.raises(CheckpointError, match="could not load the sharded part"):
        adapter.load(str(tmp_path), {"other": {"w": torch.zeros(3)}})


def _commit_sharded(final, records, *, world_size, step, meshes, keys, metadata=None):
    """Rank 0's step of a sharded save, as ``protocol.save`` takes it on a local store: the
    records must cover DCP's directory exactly, the sharded part is described, then commit."""
    from rayguard.train import protocol
    from rayguard.train.store import LocalStore

    store = LocalStore(str(Path(final).parent))
    meta = dict(metadata or {})
    protocol._describe_sharded(store, final, records, meshes, keys, world_size, meta)
    return Path(store.commit(final, records, world_size=world_size, step=step, metadata=meta))


def test_write_rank_and_commit_sharded(group, tmp_path):
    from rayguard.train import sharded as adapter

    model = _fsdp_model()
    final = str(tmp_path / "checkpoint_000000004_a0")
    staging = str(staging_dir_for(final))
    record, meshes = adapter.write_rank(staging, 0, {"model": model}, {"step": 4})
    assert {f.path for f in record.files} == {
        "shard-rank00000.safetensors", "dcp/.metadata", "dcp/__0_0.distcp"}
    path = _commit_sharded(final, [record], world_size=1, step=4, meshes=meshes,
                           keys=["model"], metadata={"attempt": 0})
    manifest = ck.read_manifest(path)
    info = sh.check_loadable(manifest, final)
    assert info["world_size"] == 1 and info["keys"] == ["model"] and info["meshes"] == meshes
    assert manifest.metadata["attempt"] == 0 and ck.verify(path).ok
    # a file nobody hashed: the commit refuses and leaves no staging directory behind
    final2 = str(tmp_path / "checkpoint_000000005_a0")
    staging2 = staging_dir_for(final2)
    record2, _ = adapter.write_rank(str(staging2), 0, {"model": model}, {"step": 5})
    (staging2 / "dcp" / "__0_1.distcp").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"written but not hashed \['__0_1.distcp'\]"):
        _commit_sharded(final2, [record2], world_size=1, step=5, meshes=[], keys=["model"])
    assert not staging2.exists() and not Path(final2).exists()


def _manifest(world_size: int, sizes: dict[str, tuple[int, int]]) -> Manifest:
    files = tuple(FileRecord(p, rank, size, "d") for p, (rank, size) in sizes.items())
    return Manifest(world_size=world_size, step=0, files=files)


def test_plan_verification_splits_every_file_once():
    m = _manifest(2, {"shard-rank00000.safetensors": (0, 10), "shard-rank00001.safetensors": (1, 10),
                      "dcp/.metadata": (0, 5), "dcp/__0_0.distcp": (0, 100), "dcp/__1_0.distcp": (1, 90)})
    same = sh.plan_verification(m, 2)
    assert same == [["shard-rank00000.safetensors", "dcp/.metadata", "dcp/__0_0.distcp"],
                    ["shard-rank00001.safetensors", "dcp/__1_0.distcp"]]
    for world in (1, 3, 5):
        plan = sh.plan_verification(m, world)
        assert len(plan) == world
        flat = [p for share in plan for p in share]
        assert sorted(flat) == sorted(f.path for f in m.files)  # each file exactly once
    three = sh.plan_verification(m, 3)
    assert three[0] == ["dcp/__0_0.distcp"] and three[1] == ["dcp/__1_0.distcp"]


def test_verify_share_hashes_only_its_files(tmp_path):
    path = _dcp_checkpoint(tmp_path, 1, 1.0)
    flip_byte(path / "dcp" / "__0_0.distcp", mask=0x01)
    shares = [sh.verify_share(path, r, 3) for r in range(3)]
    assert sum(s.files_hashed for s in shares) == 3
    bad = [s for s in shares if not s.ok]
    assert len(bad) == 1 and bad[0].problems[0].file == "dcp/__0_0.distcp"
    (path / "dcp" / ".metadata").unlink()  # a missing file: every share sees it
    assert all(not sh.verify_share(path, r, 3).ok for r in range(3))


def test_misuse_is_agreed_on_every_rank_and_fatal():
    import pickle

    from rayguard.failures import classify
    from rayguard.train.checkpointing import ShardedStateError, _agree, _Intent

    _agree([_Intent(True, 1, True, None), _Intent(False, 1, True, None)])
    _agree([_Intent(True, 1, False, None), _Intent(False, 1, False, None)])
    with pytest.raises(ShardedStateError, match=r"ranks \[1\] did not pass sharded= while ranks \[0\]"):
        _agree([_Intent(True, 1, True, None), _Intent(False, 1, False, None)])
    with pytest.raises(ShardedStateError, match="rank 1: bad"):
        _agree([_Intent(True, 1, True, None), _Intent(False, 1, True, "rank 1: bad")])
    err = pickle.loads(pickle.dumps(ShardedStateError("rank 0: x")))
    assert isinstance(err, CheckpointError) and classify(err).fatal and str(err) == "rank 0: x"
