"""Elastic shrink with sharded state: FSDP2 on a simulated 2-node cluster (one CPU, one
worker per node) loses a node; the run restarts on 1 worker, DCP reshards the checkpoint
saved by 2 ranks, and the model right after the load equals the one saved."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.cluster import SimulatedCluster, wait_for

GLOBAL, MICRO, STEPS = 4, 2, 24


def _loop(config: dict) -> None:
    import time

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1))
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sharded = {"model": model, "optim": opt}
    state = rayguard.train.load_state(sharded=sharded)
    start = 0 if state is None else state["step"] + 1

    def dump(name: str) -> None:
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # collective
        if ctx.rank == 0:
            torch.save(full, os.path.join(config["out"], name))

    if state is not None:
        dump(f"load-a{ctx.attempt}-s{state['step']}.pt")
    for step in range(start, STEPS):
        for _ in range(ctx.grad_accum_steps):  # micro x accumulation x world = GLOBAL
            model(torch.randn(MICRO, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        rayguard.train.report({"step": step, "ws": ctx.world_size}, sharded=sharded,
                              state={"step": step})
        dump(f"full-a{ctx.attempt}-s{step}-w{ctx.world_size}.pt")
        time.sleep(config["step_s"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_node_loss_reshards_fsdp_state_from_2_to_1(no_ray, tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    with SimulatedCluster(worker_nodes=2) as cluster:
        trainer = rayguard.RobustTrainer(
            _loop,
            train_loop_config={"out": str(out), "step_s": 0.3},
            scaling_config=ScalingConfig(num_workers=(1, 2), resources_per_worker={"CPU": 1},
                                         elastic_resize_monitor_interval_s=1.0),
            run_config=RunConfig(storage_path=str(tmp_path), name="elastic",
                                 failure_config=FailureConfig(max_failures=4)),
            guard_config=rayguard.GuardConfig(global_batch_size=GLOBAL, micro_batch_size=MICRO,
                                              numa="off"),
        )
        thread = cluster.fit_in_background(trainer)
        wait_for(lambda: len(glob.glob(str(out / "full-*-w2.pt"))) >= 3, timeout_s=300,
                 what="3 steps on 2 workers")
        cluster.remove_worker_node()
        cluster.join(thread, timeout_s=400)

    loads = sorted(glob.glob(str(out / "load-*.pt")))
    assert loads, "the run never restored a checkpoint after the node loss"
    name = os.path.basename(loads[-1])  # load-a<attempt>-s<step>.pt
    step = int(name.split("-s")[1].removesuffix(".pt"))
    saved = glob.glob(str(out / f"full-a*-s{step}-w2.pt"))
    assert saved, f"no dump of step {step} at 2 workers"
    loaded, before = torch.load(loads[-1], weights_only=True), torch.load(saved[-1], weights_only=True)
    assert loaded.keys() == before.keys() and all(torch.equal(loaded[k], before[k]) for k in loaded)
    assert glob.glob(str(out / f"full-a*-s{STEPS - 1}-w1.pt")), "training did not finish on 1 worker"
    events = read_events(str(tmp_path / "elastic"))
    restored = [e for e in events if e["kind"] == "restored" and e.get("saved_world_size") == 2]
    assert any("resharded to 1 by DCP" in e["detail"] for e in restored)
