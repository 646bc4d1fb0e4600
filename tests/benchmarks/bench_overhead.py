"""Reporting overhead: the same 2-worker CPU job (20 steps, a report every step) with plain
``TorchTrainer`` and with ``RobustTrainer``, in one process, several repetitions.

Prints medians of fit() wall time, of the time each report call blocks, and of compute time
per step, with ratios. Targets: median metrics-only report <= 50 ms; fit() >= 3x faster
than plain; compute per step within 3% of plain.

    .venv/bin/python tests/benchmarks/bench_overhead.py [--reps 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def loop(config):
    import ray.train
    import torch

    import rayguard

    guarded = config["guarded"]
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 256)
    blocks, computes = [], []
    for step in range(config["steps"]):
        t0 = time.perf_counter()
        for _ in range(config["inner"]):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        t1 = time.perf_counter()
        metrics = {"loss": float(loss), "step": step}
        if guarded:
            rayguard.train.report(metrics)
        else:
            ray.train.report(metrics)
        t2 = time.perf_counter()
        computes.append(t1 - t0)
        blocks.append(t2 - t1)
    with open(os.path.join(config["out"], f"{config['tag']}-rank{rank}.json"), "w") as f:
        json.dump({"blocks": blocks, "computes": computes}, f)


def run_once(guarded: bool, steps: int, inner: int, out: str, tag: str) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import rayguard

    cls = rayguard.RobustTrainer if guarded else TorchTrainer
    kwargs = {"guard_config": rayguard.GuardConfig(numa="off")} if guarded else {}
    trainer = cls(loop, train_loop_config={"guarded": guarded, "steps": steps, "inner": inner,
                                           "out": out, "tag": tag},
                  scaling_config=ScalingConfig(num_workers=2),
                  run_config=RunConfig(storage_path=out, name=tag), **kwargs)
    t0 = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - t0
    blocks, computes = [], []
    for r in range(2):
        with open(os.path.join(out, f"{tag}-rank{r}.json")) as f:
            d = json.load(f)
        blocks += d["blocks"]
        computes += d["computes"][1:]  # first step warms up
    return {"wall": wall, "block": statistics.median(blocks), "compute": statistics.median(computes)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inner", type=int, default=5, help="optimizer steps per reported step")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.reps = 1
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = tempfile.mkdtemp(prefix="bench-overhead-")
    rows: dict[str, list[dict]] = {"plain": [], "rayguard": []}
    for rep in range(args.reps):
        for name, guarded in (("plain", False), ("rayguard", True)):
            rows[name].append(run_once(guarded, args.steps, args.inner, out, f"{name}{rep}"))
            print(f"rep {rep} {name:9s} {rows[name][-1]}", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("wall", "block", "compute")}
           for name, rs in rows.items()}
    p, g = med["plain"], med["rayguard"]
    print(f"\n{'':10s}{'fit() s':>10s}{'report ms':>12s}{'compute ms':>12s}")
    for name in ("plain", "rayguard"):
        m = med[name]
        print(f"{name:10s}{m['wall']:10.2f}{m['block'] * 1e3:12.2f}{m['compute'] * 1e3:12.2f}")
    print(f"\nfit() speed-up (plain / rayguard): {p['wall'] / g['wall']:.2f}x (target >= 3x)")
    print(f"report blocking: {g['block'] * 1e3:.2f} ms vs {p['block'] * 1e3:.0f} ms "
          f"(target <= 50 ms)")
    print(f"compute per step ratio (rayguard / plain): {g['compute'] / p['compute']:.3f} "
          "(target within 3%)")


if __name__ == "__main__":
    main()
