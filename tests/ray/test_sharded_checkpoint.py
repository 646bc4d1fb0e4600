"""Sharded state (FSDP2 ``fully_shard`` on CPU/gloo, AdamW) through ``report(sharded=...)`` on
a real local cluster: exact resume after a kill, resharding 2 -> 3 workers, and corrupt DCP
files rejected with fallback, the older checkpoint resharded 2 -> 1 as it loads. (The
DTensor-in-``state=`` error is proved with a real DTensor in
tests/unit/checkpoint/test_checkpoint_sharded.py; its end-to-end path, an error never
retried, by tests/ray/test_crash_loop.py's unsaveable state.)"""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import pytest
import torch

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer

pytestmark = pytest.mark.timeout(900)  # several runs of process start-up on a loaded 2-core machine


def _full(model):
    """The whole model on every rank (a collective), as plain CPU tensors."""
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def fsdp_loop(config):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)  # the same initial model on every rank, at every world size
    model = torch.nn.Sequential(torch.nn.Linear(8, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sharded = {"model": model, "optim": opt}
    state = rayguard.train.load_state(sharded=sharded)
    start = 0 if state is None else state["step"] + 1
    loaded = _full(model)
    if state is not None and ctx.rank == 0 and config.get("after_load"):
        torch.save(loaded, config["after_load"])
    for step in range(start, config["steps"]):
        x = torch.randn(16, 8)  # this rank's RNG: exact only if its RNG state is restored
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rayguard.train.report({"loss": loss.item(), "step": step}, sharded=sharded,
                              state={"step": step})
        full = _full(model)
        if ctx.rank == 0 and step in config.get("dump_at", {}):
            torch.save(full, config["dump_at"][step])
    full = _full(model)
    dist.barrier()
    if ctx.rank == 0:
        torch.save(full, config["out"])


def _fit(tmp_path, name, *, workers=2, faults=None, **config):
    out = str(tmp_path / f"{name}-w{workers}.pt")
    guard = rayguard.GuardConfig(seed=0, faults=faults, numa="off")
    result = make_trainer(fsdp_loop, tmp_path, num_workers=workers, config={"out": out, **config},
                          guard=guard, name=name).fit()
    return torch.load(out, weights_only=True), read_events(result.path), result.path


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _kinds(events):
    return [e["kind"] for e in events]


STEPS = 6


@pytest.fixture(scope="module")
def clean(ray_local_module, tmp_path_factory):
    """A fault-free run of 2 workers, steps 0..5, its whole model dumped at steps 1 and 5:
    the weights a faulty run must end with, and the run that the reshard and damage tests
    resume from (each in a copy of its own)."""
    root = tmp_path_factory.mktemp("clean")
    dumps = {1: str(root / "at1.pt"), STEPS - 1: str(root / "at5.pt")}
    weights, events, path = _fit(root, "clean", steps=STEPS, dump_at=dumps)
    assert "restart" not in _kinds(events)
    return SimpleNamespace(weights=weights, path=path, dumps=dumps, events=events)


def _copy(clean, tmp_path, name):
    """A copy of the clean run's directory as run ``name``: ``{step: checkpoint path}``."""
    shutil.copytree(clean.path, tmp_path / name)
    return {e["step"]: str(tmp_path / name / os.path.basename(e["path"]))
            for e in clean.events if e["kind"] == "checkpoint_committed"}


def test_kill_rank1_resumes_bitwise(clean, tmp_path):
    weights, events, run = _fit(tmp_path, "kill", faults="kill:rank=1,step=4", steps=STEPS)
    kinds = _kinds(events)
    assert "worker_died" in kinds and "restart" in kinds
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored and restored[0]["step"] == 3
    assert _equal(weights, clean.weights)
    # every DCP file is in the manifest, with the world size and the mesh
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.sharded import sharded_info

    path = restored[0]["path"]
    manifest = ck.read_manifest(path)
    listed = {f.path for f in manifest.files}
    assert {f"dcp/{n}" for n in os.listdir(os.path.join(path, "dcp"))} <= listed
    info = sharded_info(manifest)
    assert info["world_size"] == 2 and info["meshes"][0]["shape"] == [2]
    assert ck.verify(path).ok


def test_reshard_on_restart_at_another_size(clean, tmp_path):
    """Saved by 2 ranks, resumed by 3 (2 -> 1: the damaged checkpoints' test below)."""
    _copy(clean, tmp_path, "reshard")  # saved by 2 ranks, steps 0..5
    after_load = str(tmp_path / "after_load.pt")
    _, events, _ = _fit(tmp_path, "reshard", workers=3, steps=STEPS + 2,
                        after_load=after_load)
    at5 = torch.load(clean.dumps[STEPS - 1], weights_only=True)
    assert _equal(torch.load(after_load, weights_only=True), at5)
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored[-1]["saved_world_size"] == 2 and "resharded to" in restored[-1]["detail"]
    committed = [e["step"] for e in events if e["kind"] == "checkpoint_committed"]
    assert committed[-2:] == [STEPS, STEPS + 1]  # training continued at the new size


def test_damaged_and_forged_dcp_checkpoints_are_rejected_and_an_older_one_loads(
        clean, tmp_path):
    """Each of the four newest checkpoints is damaged in its own way: a flipped byte, a
    missing ``.metadata``, a truncated shard, and (someone with write access to the run
    directory) a ``dcp/.metadata`` replaced by a pickle that runs a command, its manifest
    entry rewritten so the sha256 matches. The restart, on one worker, rejects each (naming
    what is wrong, the forged one by the class it refuses to unpickle), loads the fifth once
    (no crash loop), resharded from the 2 ranks that saved it, and the command never runs in
    any worker."""
    from rayguard.testing.forge import command_pickle, flip_byte, forge_file

    by_step = _copy(clean, tmp_path, "damaged")
    flip_byte(os.path.join(by_step[5], "dcp", "__1_0.distcp"), mask=0x01)
    os.remove(os.path.join(by_step[4], "dcp", ".metadata"))
    with open(os.path.join(by_step[3], "dcp", "__0_0.distcp"), "r+b") as f:
        f.truncate(os.path.getsize(f.name) - 7)
    marker = tmp_path / "pwned"
    forge_file(by_step[2], "dcp/.metadata", command_pickle(f"touch {marker}"))
    after_load = str(tmp_path / "after_load.pt")
    _, events, _ = _fit(tmp_path, "damaged", workers=1, steps=2, after_load=after_load)
    assert not marker.exists()
    rejected = {e["path"]: e["detail"] for e in events if e["kind"] == "checkpoint_rejected"}
    assert "__1_0.distcp: blake3 mismatch" in rejected[by_step[5]]
    assert ".metadata: missing" in rejected[by_step[4]]
    assert "__0_0.distcp: size is" in rejected[by_step[3]]
    assert "refusing to unpickle posix.system" in rejected[by_step[2]]
    restored = [e for e in events if e["kind"] == "restored"]
    assert [e["path"] for e in restored] == [by_step[1]]  # loaded once: no crash loop
    assert restored[0]["saved_world_size"] == 2 and "resharded to" in restored[0]["detail"]
    assert "restart" not in _kinds(events)
    assert _equal(torch.load(after_load, weights_only=True),
                  torch.load(clean.dumps[1], weights_only=True))
