"""Elastic training on one machine: lose a node, keep going, get it back.

A simulated cluster of 3 one-CPU nodes runs a DDP job with a constant global batch of 12
(micro-batch 2). A node is removed after a few steps: the run restarts from its latest
checkpoint on 2 workers with accumulation 3 instead of 2, and the data position carries on
exactly. Then a node is added back and the run grows to 3 workers again.

With live recovery (the default here) both resizes are made in place: the surviving
workers keep their processes and run the training function again with the new world size
and accumulation; only the returning node's worker starts. ``--recovery restart`` restarts
the whole worker group at each resize instead (Ray Train's own elastic restart).

    .venv/bin/python examples/elastic.py                      # resized in place
    .venv/bin/python examples/elastic.py --recovery restart   # each resize restarts workers
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time

import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig

import rayguard
from rayguard.testing.cluster import SimulatedCluster, wait_for

GLOBAL, MICRO, SAMPLES, EPOCHS = 12, 2, 480, 2


def train_fn(config: dict) -> None:
    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = rayguard.train.ElasticSampler(SAMPLES, global_batch_size=GLOBAL, micro_batch_size=MICRO,
                                            rank=ctx.rank, world_size=ctx.world_size, seed=0)
    state = rayguard.train.load_state()
    step = 0
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load_state_dict(state["sampler"])
        step = state["step"]
    g = torch.Generator().manual_seed(0)
    x_all, w = torch.randn(SAMPLES, 4, generator=g), torch.tensor([1.0, -2.0, 0.5, 3.0])
    data = torch.utils.data.TensorDataset(x_all, x_all @ w)
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        batches = iter(torch.utils.data.DataLoader(data, batch_size=MICRO, sampler=sampler))
        for _ in range(sampler.steps_remaining()):
            for k in range(ctx.grad_accum_steps):
                x, y = next(batches)
                last = k == ctx.grad_accum_steps - 1
                with (torch.enable_grad() if last else model.no_sync()):
                    # mean over the micro-batch, averaged over the accumulation: the gradient of
                    # the mean loss over the global batch, whatever the world size
                    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y) / ctx.grad_accum_steps
                    loss.backward()
            opt.step()
            opt.zero_grad()
            sampler.advance()
            step += 1
            with open(os.path.join(config["out"], f"{os.getpid()}.jsonl"), "a") as f:
                f.write(json.dumps({"step": step, "ws": ctx.world_size, "accum": ctx.grad_accum_steps,
                                    "rank": ctx.rank, "pid": os.getpid(),
                                    "loss": loss.item() * ctx.grad_accum_steps}) + "\n")
            time.sleep(config["step_s"])
            rayguard.train.report(
                {"loss": loss.item() * ctx.grad_accum_steps, "step": step}, step=step,
                state={"model": model.module.state_dict(), "opt": opt.state_dict(),
                       "sampler": sampler.state_dict(), "step": step} if ctx.rank == 0 else None)


def steps(out: str) -> list[dict]:
    rows = []
    for path in glob.glob(os.path.join(out, "*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.endswith("\n")]
    return sorted((r for r in rows if r["rank"] == 0), key=lambda r: r["step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recovery", choices=("live", "restart"), default="live",
                        help="resize in place (live) or restart the worker group (restart)")
    parser.add_argument("--step-s", type=float, default=0.5,
                        help="seconds each step waits after its optimizer step (default 0.5)")
    args = parser.parse_args()
    if not 0 < args.step_s <= 60:
        parser.error(f"--step-s {args.step_s}: give seconds between 0 and 60, e.g. 0.5")
    root = tempfile.mkdtemp(prefix="rayguard-elastic-")
    out = os.path.join(root, "steps")
    os.makedirs(out)
    with SimulatedCluster(worker_nodes=3) as cluster:
        trainer = rayguard.RobustTrainer(
            train_fn,
            train_loop_config={"out": out, "step_s": args.step_s},
            scaling_config=ScalingConfig(num_workers=(1, 3), resources_per_worker={"CPU": 1},
                                         elastic_resize_monitor_interval_s=1.0),
            run_config=RunConfig(storage_path=root, name="elastic",
                                 failure_config=FailureConfig(max_failures=3)),
            guard_config=rayguard.GuardConfig(global_batch_size=GLOBAL, micro_batch_size=MICRO,
                                              recovery=args.recovery),
        )
        thread = cluster.fit_in_background(trainer)
        wait_for(lambda: len(steps(out)) >= 4, timeout_s=300, what="4 steps")
        print(f"removing node {cluster.remove_worker_node()[:12]}...", flush=True)
        wait_for(lambda: any(r["ws"] == 2 for r in steps(out)), timeout_s=300, what="2 workers")
        print("adding a node back", flush=True)
        cluster.add_worker_node()
        result = cluster.join(thread, timeout_s=900)
    seen: dict[int, dict] = {r["step"]: r for r in steps(out)}  # a replayed step: last run wins
    for s, r in sorted(seen.items()):
        print(f"step {s:3d}  world {r['ws']}  accumulation {r['accum']}  "
              f"{MICRO} x {r['accum']} x {r['ws']} = {MICRO * r['accum'] * r['ws']}  "
              f"loss {r['loss']:.4f}  rank 0 pid {r['pid']}")
    print(f"final loss {result.metrics['loss']:.4f}; run directory {result.path}")


if __name__ == "__main__":
    main()
