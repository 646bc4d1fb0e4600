"""Reporting overhead: the same 2-worker CPU job (20 steps, a report every step) with plain
``TorchTrainer`` and with ``RobustTrainer``, in one process, several repetitions.

Prints medians of fit() wall time, of the time each report call blocks, and of compute time
per step, with ratios. Targets: median metrics-only report <= 50 ms; fit() >= 3x faster
than plain; compute per step within 3% of plain.

    .venv/bin/python tests/benchmarks/bench_overhead.py [--reps 3] [--steps 20]

Second part (``--observe-only`` runs it alone): the cost of rayguard's step timing, metrics
and straggler summaries on a 0.1 ms and a 10 ms step (a busy-wait, so the step is exact).
The same RobustTrainer loop runs with the step timer on (summaries every 0.5 s, 10x more
often than the default) and off (replaced by a no-op in the worker); it prints the median
time per step of each and the ratio (target < 1% on the 10 ms step), plus the in-process
cost of one ``StepTimer.on_report`` call.
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


def spin_loop(config):
    import ray.train

    import rayguard
    from rayguard.train.setup import current_session

    session = current_session()
    if not config["observe"]:  # the baseline: no step timing, no summaries, no metrics
        session.timer = _NoTimer()
    rank = ray.train.get_context().get_world_rank()
    step_s, per_step = config["step_s"], []
    for step in range(config["steps"]):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < step_s:  # the "compute"
            pass
        rayguard.train.report({"loss": 1.0, "step": step})
        per_step.append(time.perf_counter() - t0)
    with open(os.path.join(config["out"], f"{config['tag']}-rank{rank}.json"), "w") as f:
        json.dump(per_step[len(per_step) // 10:], f)  # drop warm-up


class _NoTimer:
    def on_report(self, step, metrics, blocked_s):
        return None

    def take(self):
        return None


def observe_once(observe: bool, step_s: float, steps: int, out: str, tag: str) -> float:
    from ray.train import RunConfig, ScalingConfig

    import rayguard

    health = rayguard.HealthConfig(step_summary_interval_s=0.5, straggler_window_s=5.0)
    trainer = rayguard.RobustTrainer(
        spin_loop, train_loop_config={"observe": observe, "step_s": step_s, "steps": steps,
                                      "out": out, "tag": tag},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=out, name=tag),
        guard_config=rayguard.GuardConfig(numa="off", preflight=False, health=health))
    trainer.fit()
    times = []
    for r in range(2):
        with open(os.path.join(out, f"{tag}-rank{r}.json")) as f:
            times += json.load(f)
    return statistics.median(times)


def timer_call_cost_s(n: int = 200_000) -> float:
    from rayguard.observe.steps import StepTimer

    timer = StepTimer(interval_s=5.0)
    metrics = {"loss": 1.0}
    t0 = time.perf_counter()
    for step in range(n):
        timer.on_report(step, metrics, 1e-5)
    return (time.perf_counter() - t0) / n


def observe_main(reps: int) -> None:
    out = tempfile.mkdtemp(prefix="bench-observe-")
    print(f"\nStepTimer.on_report: {timer_call_cost_s() * 1e9:.0f} ns per report (in process)")
    print(f"\n{'step':>8s}{'timer off ms':>14s}{'timer on ms':>13s}{'ratio':>8s}")
    for step_s, steps in ((0.0001, 20000), (0.01, 400)):
        rows: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(reps):
            for observe in (False, True):
                tag = f"obs{int(observe)}-{step_s}-{rep}"
                rows[observe].append(observe_once(observe, step_s, steps, out, tag))
        off, on = statistics.median(rows[False]), statistics.median(rows[True])
        print(f"{step_s * 1e3:6.1f}ms{off * 1e3:14.4f}{on * 1e3:13.4f}{on / off:8.4f}", flush=True)
    print("target: ratio < 1.01 on the 10 ms step (time per step, report call included)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--observe-only", action="store_true",
                        help="only the step-timing/metrics/straggler cost")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inner", type=int, default=5, help="optimizer steps per reported step")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.reps = 1
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    if args.observe_only:
        observe_main(args.reps)
        return
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
    observe_main(args.reps)


if __name__ == "__main__":
    main()
