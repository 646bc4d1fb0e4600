"""NaN to the next step: in-place rollback (``GuardConfig(recovery="live")``) vs the group
restart (``"restart"``), RobustTrainer, 2 CPU workers, DDP on gloo.

A loss of NaN is injected on rank 0 at step ``--nan-step``; every step is checkpointed
(``--memory-tier`` keeps the copy in memory too; ``--loop ray``: a loop that reports its
checkpoints through ``ray.train.report`` instead of ``rayguard.train.report(state=)``). Printed per mode: the seconds from the NaN
step's report to the same step done again after the recovery (rank 0's clock), the run's
wall time, and whether every rank kept its process. Target (live): <= 1 s. Run under the
shared lock:

    flock /tmp/rayguard-ray.lock .venv/bin/python tests/benchmarks/bench_rollback.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def _model():
    """The same model, DDP wrapper and optimizer in both loops (seeded)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    return model, ddp, torch.optim.Adam(ddp.parameters(), lr=0.01)


def _step(ddp, opt, log, rank, step):
    """One training step, then its time in ``log`` (rank, pid, step, time); its loss."""
    import torch

    loss = ddp(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(log, "a") as f:
        f.write(json.dumps({"rank": rank, "pid": os.getpid(), "step": step,
                            "t": time.time()}) + "\n")
    return loss


def loop(config):
    import torch.distributed as dist

    import rayguard

    ctx = rayguard.train.get_context()
    model, ddp, opt = _model()
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    for step in range(start, config["steps"]):
        loss = _step(ddp, opt, config["log"], ctx.rank, step)
        rayguard.train.report({"loss": loss.item(), "step": step},
                              state={"model": model.state_dict(), "optim": opt.state_dict(),
                                     "step": step} if ctx.rank == 0 else None)
    dist.barrier()


def ray_loop(config):
    """The same steps, written as Ray's docs write a loop: rank 0 reports a checkpoint at
    every step with ``ray.train.report``, every rank resumes from ``ray.train.get_checkpoint()``."""
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    model, ddp, opt = _model()
    start, checkpoint = 0, ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        start = saved["step"] + 1
    for step in range(start, config["steps"]):
        loss = _step(ddp, opt, config["log"], rank, step)
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                            "step": step}, os.path.join(d, "state.pt"))
            ray.train.report({"loss": loss.item(), "step": step},
                             checkpoint=ray.train.Checkpoint.from_directory(d) if rank == 0
                             else None)
    dist.barrier()


def run(recovery: str, args: argparse.Namespace, root: str) -> dict:
    from ray.train import RunConfig, ScalingConfig

    import rayguard

    log = os.path.join(root, f"{recovery}.jsonl")
    guard = rayguard.GuardConfig(numa="off", recovery=recovery,
                                 faults=f"nan:rank=0,step={args.nan_step}",
                                 checkpoint=rayguard.CheckpointConfig(
                                     memory_tier=args.memory_tier))
    started = time.perf_counter()
    rayguard.RobustTrainer(ray_loop if args.loop == "ray" else loop, train_loop_config={"steps": args.steps, "log": log},
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(storage_path=root, name=recovery),
                           guard_config=guard).fit()
    wall = time.perf_counter() - started
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    at_nan = [r["t"] for r in rows if r["rank"] == 0 and r["step"] == args.nan_step]
    pids = {rank: {r["pid"] for r in rows if r["rank"] == rank} for rank in (0, 1)}
    return {"nan_to_next_step_s": round(at_nan[1] - at_nan[0], 3) if len(at_nan) > 1 else None,
            "wall_s": round(wall, 2), "kept_processes": all(len(p) == 1 for p in pids.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--nan-step", type=int, default=15)
    parser.add_argument("--memory-tier", action="store_true")
    parser.add_argument("--loop", choices=("rayguard", "ray"), default="rayguard",
                        help='"ray": the loop reports checkpoints with ray.train.report')
    args = parser.parse_args()
    import ray

    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as root:
        figures = {mode: run(mode, args, root) for mode in ("live", "restart")}
    ray.shutdown()
    print(json.dumps(figures, indent=1))
    live, restart = figures["live"]["nan_to_next_step_s"], figures["restart"]["nan_to_next_step_s"]
    if live and restart:
        print(f"NaN to next step: live {live} s, restart {restart} s (ratio {live / restart:.2f})")


if __name__ == "__main__":
    main()
