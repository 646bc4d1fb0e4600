"""NaN/inf rolled back in place (``GuardConfig(recovery="live")``) on a real local cluster
(2 CPU workers, DDP on gloo): every rank agrees at the NaN's report and re-enters the
training function in its own process from the last committed checkpoint (disk, or the
memory tier); no worker restarts, and the weights end bitwise equal to a run without
faults."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer

STEPS = 8


def live_loop(config):
    import ray.train
    import torch.distributed as dist

    ctx = rayguard.train.get_context()
    rctx = ray.train.get_context()  # Ray's view: the same after an in-place rollback
    entered = {"rank": ctx.rank, "pid": os.getpid(), "ctx": id(ctx), "attempt": ctx.attempt,
               "ray_ctx": [rctx.get_world_rank(), rctx.get_world_size(), rctx.get_local_rank(),
                           rctx.get_experiment_name(), rctx.get_storage().experiment_fs_path]}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    state = rayguard.train.load_state()
    checkpoint = ray.train.get_checkpoint()
    entered["ray_checkpoint"] = None if checkpoint is None else os.path.basename(checkpoint.path)
    entered["loaded_step"] = None if state is None else state["step"]
    with open(config["log"], "a") as f:
        f.write(json.dumps(entered) + "\n")
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    for step in range(start, config["steps"]):
        x = torch.randn(16, 8)  # the rank's RNG: exact only if RNG state is restored
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        if ctx.rank == 0:
            with open(config["log"] + ".steps", "a") as f:
                f.write(json.dumps({"step": step, "t": time.time()}) + "\n")
        rayguard.train.report({"loss": loss.item(), "step": step},
                              state=state if ctx.rank == 0 else None)
    dist.barrier()
    if ctx.rank == 0:
        torch.save(model.state_dict(), config["out"])


def _fit(tmp_path, name, faults=None, mode="sync", memory_tier=False, recovery="live"):
    out, log = str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.jsonl")
    guard = rayguard.GuardConfig(seed=0, faults=faults, numa="off", recovery=recovery,
                                 checkpoint=rayguard.CheckpointConfig(mode=mode,
                                                                      memory_tier=memory_tier))
    result = make_trainer(live_loop, tmp_path, config={"steps": STEPS, "out": out, "log": log},
                          guard=guard, name=name).fit()
    with open(log) as f:
        entered = [json.loads(line) for line in f if line.strip()]
    return torch.load(out, weights_only=True), read_events(result.path), entered


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def clean(ray_local_module, tmp_path_factory):
    weights, events, _ = _fit(tmp_path_factory.mktemp("clean"), "clean")
    assert "restart" not in [e["kind"] for e in events]
    return weights


@pytest.mark.parametrize(("mode", "memory_tier"), [("sync", False), ("async", False),
                                                   ("sync", True)])
def test_nan_rolls_back_in_place_exactly(clean, tmp_path, mode, memory_tier):
    weights, events, entered = _fit(tmp_path, "nan", faults="nan:rank=0,step=4", mode=mode,
                                    memory_tier=memory_tier)
    assert _equal(weights, clean)
    kinds = [e["kind"] for e in events]
    assert "worker_died" not in kinds  # Ray never restarted the group
    assert kinds.count("restart") == 1 and kinds[-1] == "finished"
    restart = next(e for e in events if e["kind"] == "restart")
    assert restart["path"] == "in_place" and restart["step"] == 4
    assert set(restart["phases"]) == {"agree_s", "settle_s"}
    nan = next(e for e in events if e["kind"] == "nan_detected")
    assert nan["step"] == 4 and nan["path"] == "in_place"
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored[-1]["step"] == 3 and restored[-1]["attempt"] == 1
    from rayguard.observe.goodput import goodput

    assert goodput(events).replayed_steps == 1  # step 4 only, done again from step 3
    if memory_tier:
        assert restored[-1]["tier"] == "memory", restored[-1]
    started = [e for e in events if e["kind"] == "attempt_started"]
    assert [e["attempt"] for e in started] == [0, 1] and started[1]["path"] == "in_place"
    # No checkpoint was committed for the NaN step in the attempt that saw it.
    assert not [e for e in events if e["kind"] == "checkpoint_committed"
                and e["step"] == 4 and e["attempt"] == 0]
    for rank in (0, 1):
        runs = [e for e in entered if e["rank"] == rank]
        assert len(runs) == 2, entered  # the function ran twice in one process
        assert runs[0]["pid"] == runs[1]["pid"] and runs[0]["ctx"] == runs[1]["ctx"]
        assert runs[0]["ray_ctx"] == runs[1]["ray_ctx"] and runs[0]["ray_ctx"][0] == rank
        assert [r["attempt"] for r in runs] == [0, 1]
        assert runs[0]["loaded_step"] is None and runs[1]["loaded_step"] == 3
        # ray.train.get_checkpoint(): the rolled-back one, on every rank
        assert runs[1]["ray_checkpoint"] == "checkpoint_000000003_a0", entered


def test_restart_budget_bounds_in_place_rollbacks(ray_local_module, tmp_path):
    from ray.train import FailureConfig

    guard = rayguard.GuardConfig(seed=0, numa="off", recovery="live",
                                 faults="nan:rank=1,step=2;nan:rank=0,step=5")
    log = str(tmp_path / "budget.jsonl")
    trainer = make_trainer(live_loop, tmp_path, guard=guard, name="budget",
                           config={"steps": STEPS, "out": str(tmp_path / "b.pt"), "log": log},
                           failure_config=FailureConfig(max_failures=1))
    with pytest.raises(Exception, match="max_failures=1"):
        trainer.fit()
    events = read_events(trainer.run_dir)
    assert [e.get("path") for e in events if e["kind"] == "restart"] == ["in_place"]
