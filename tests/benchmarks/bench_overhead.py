"""Reporting overhead: the same 2-worker CPU job (20 steps, a report every step) with plain
``TorchTrainer`` and with ``RobustTrainer``, in one process, several repetitions.

Prints medians of fit() wall time, of the time each report call blocks, and of compute time
per step, with ratios. Targets: median metrics-only report <= 50 ms; fit() >= 3x faster
than plain; compute per step within 3% of plain.

    .venv/bin/python tests/benchmarks/bench_overhead.py [--reps 3] [--steps 20]

Second part (``--observe-only`` runs it alone): the cost of rayguard's step timing, metrics
and straggler summaries on a 0.1 ms and a 10 ms step (a busy-wait, so the step is exact):
a Ray actor runs the loop with what observability adds to each report (the step timer, and a
fire-and-forget summary to a real run coordinator every 0.5 s, 10x more often than the
default) and without it; it prints the mean time per step of each and the ratio (target < 1%
on the 10 ms step), plus the in-process cost of one ``StepTimer.on_report`` call.

Third part (``--report-cost-only`` runs it alone): the cost of one metrics-only report, timed
inside each worker (``perf_counter`` around the call, 500 reports, the first left out: it
carries the preflight gather), at world sizes 2 and 8 (CPU workers, RobustTrainer on the local
cluster), with a plain TorchTrainer calling ``ray.train.report`` in the same process as the
baseline (the controller polled every 50 ms there too, as rayguard sets it; fewer reports,
since each one waits for a poll). Target: median < 1 ms.
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


class SpinWorker:
    """A Ray actor standing in for a training worker: a fixed amount of work per step
    (calibrated to the step time), then what rayguard's report adds for observability
    (``StepTimer.on_report`` and, when a summary is due, one fire-and-forget call to a real
    run coordinator). CPU time of the process is measured beside wall time: on a shared
    machine, wall time also measures the neighbours (preemption)."""

    def calibrate(self, step_s: float) -> int:
        n = 1000
        while True:
            t0 = time.process_time()
            _work(n)
            took = time.process_time() - t0
            if took > 0.05:
                return max(int(n * step_s / took), 1)
            n *= 2

    def run(self, coordinator, observe: bool, iters: int, steps: int,
            interval_s: float = 0.5) -> tuple[float, float]:
        from rayguard.observe.steps import StepTimer

        timer = StepTimer(interval_s=interval_s)
        t0, c0 = time.perf_counter(), time.process_time()
        for step in range(steps):
            _work(iters)  # the "compute"
            if observe:
                summary = timer.on_report(step, {"loss": 1.0}, 1e-5)
                if summary is not None:
                    summary.update(rank=0, node="n", attempt=0, gpu_ids=[], time=time.time())
                    coordinator.step_summary.remote(summary)
        return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


    def submit_cost(self, coordinator, n: int = 500) -> float:
        """Seconds one fire-and-forget summary call takes in the caller."""
        import ray

        summary = {"rank": 0, "node": "n", "attempt": 0, "gpu_ids": [], "time": time.time(),
                   "reports": 1, "intervals": 1, "step_time_sum_s": 0.01, "blocked_sum_s": 0.0,
                   "first_step": 0, "last_step": 0, "first_time": time.time(), "metric": "loss",
                   "samples": [[i, 1.0] for i in range(64)]}
        refs = []
        t0 = time.perf_counter()
        for _ in range(n):
            refs.append(coordinator.step_summary.remote(summary))
        took = (time.perf_counter() - t0) / n
        ray.get(refs)
        return took


def _work(n: int) -> float:
    x = 0.0
    for i in range(n):
        x += i * 0.5
    return x


def observe_once(coordinator, worker, observe: bool, iters: int, steps: int,
                 interval_s: float = 0.5) -> tuple[float, float]:
    import ray

    return ray.get(worker.run.remote(coordinator, observe, iters, steps, interval_s))


def timer_call_cost_s(n: int = 200_000) -> float:
    from rayguard.observe.steps import StepTimer

    timer = StepTimer(interval_s=5.0)
    metrics = {"loss": 1.0}
    t0 = time.perf_counter()
    for step in range(n):
        timer.on_report(step, metrics, 1e-5)
    return (time.perf_counter() - t0) / n


def observe_main(reps: int, interval_s: float = 0.5) -> None:
    """Time per step (the occasional actor call included), timer on vs off, interleaved.

    Why not through RobustTrainer: the rest of ``report`` is the same with or without step
    timing, and rayguard's forwarder hands reports to Ray Train one controller poll (50 ms)
    apart, so a 0.1 ms loop reporting every step would spend minutes draining its backlog."""
    import ray

    from rayguard.run.coordinator import start_coordinator

    out = tempfile.mkdtemp(prefix="bench-observe-")
    coordinator = start_coordinator(os.path.join(out, "events.jsonl"),
                                    observe={"run": "bench", "straggler_window_s": 5.0})
    worker = ray.remote(num_cpus=1)(SpinWorker).remote()
    print(f"\nStepTimer.on_report: {timer_call_cost_s() * 1e9:.0f} ns per report (in process)")
    print(f"\nsummaries every {interval_s:g} s (the default is 5 s)")
    print(f"{'step':>8s}{'':>4s}{'timer off ms':>14s}{'timer on ms':>13s}{'ratio':>8s}")
    for step_s, steps in ((0.0001, 50_000), (0.01, 600)):
        iters = ray.get(worker.calibrate.remote(step_s))
        rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for rep in range(reps):  # alternate the order: the second run of a pair is not favoured
            for observe in ((False, True) if rep % 2 == 0 else (True, False)):
                rows[observe].append(observe_once(coordinator, worker, observe, iters, steps,
                                                  interval_s))
        for i, what in ((1, "cpu"), (0, "wall")):
            off = statistics.median(r[i] for r in rows[False])
            on = statistics.median(r[i] for r in rows[True])
            print(f"{step_s * 1e3:6.1f}ms{what:>4s}{off * 1e3:14.4f}{on * 1e3:13.4f}{on / off:8.4f}",
                  flush=True)
    print("target: ratio < 1.01 on the 10 ms step (cpu: what it costs; wall: also the neighbours)")
    timer_s = timer_call_cost_s()
    submit_s = ray.get(worker.submit_cost.remote(coordinator))
    print(f"\nfrom the parts: {timer_s * 1e6:.2f} us per report (timer) + one summary call of "
          f"{submit_s * 1e6:.0f} us per interval")
    for interval_s in (5.0, 0.5):
        for step_s in (0.0001, 0.01):
            per_step = timer_s + submit_s * step_s / interval_s
            print(f"  interval {interval_s:3.1f} s, {step_s * 1e3:4.1f} ms step: "
                  f"{per_step * 1e6:6.2f} us per step = {per_step / step_s * 100:.3f}%")
    print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def report_cost_loop(config):
    import ray.train

    import rayguard

    rank = ray.train.get_context().get_world_rank()
    report = rayguard.train.report if config["guarded"] else ray.train.report
    took = []
    for step in range(config["reports"]):
        t0 = time.perf_counter()
        report({"loss": 1.0, "step": step})
        took.append(time.perf_counter() - t0)
    with open(os.path.join(config["out"], f"{config['tag']}-rank{rank}.json"), "w") as f:
        json.dump(took[1:], f)


def report_cost_once(guarded: bool, world_size: int, reports: int, out: str) -> list[float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import rayguard
    from rayguard.constants import RAY_TRAIN_POLL_INTERVAL_ENV_VAR

    tag = f"{'rayguard' if guarded else 'plain'}-w{world_size}"
    cls = rayguard.RobustTrainer if guarded else TorchTrainer
    kwargs = {"guard_config": rayguard.GuardConfig(numa="off", preflight=False)} if guarded else {}
    saved = os.environ.get(RAY_TRAIN_POLL_INTERVAL_ENV_VAR)
    os.environ.setdefault(RAY_TRAIN_POLL_INTERVAL_ENV_VAR, "0.05")
    try:
        cls(report_cost_loop,
            train_loop_config={"guarded": guarded, "reports": reports, "out": out, "tag": tag},
            scaling_config=ScalingConfig(num_workers=world_size,
                                         resources_per_worker={"CPU": 0.2}),
            run_config=RunConfig(storage_path=out, name=tag), **kwargs).fit()
    finally:
        if saved is None:
            os.environ.pop(RAY_TRAIN_POLL_INTERVAL_ENV_VAR, None)
    took: list[float] = []
    for rank in range(world_size):
        with open(os.path.join(out, f"{tag}-rank{rank}.json")) as f:
            took += json.load(f)
    return took


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_cost_main(reports: int = 500, plain_reports: int = 40) -> None:
    out = tempfile.mkdtemp(prefix="bench-report-cost-")
    print(f"\nmetrics-only report, timed in the worker ({reports} reports per rank; plain: "
          f"{plain_reports})")
    print(f"{'world':>6s}{'':>10s}{'median ms':>11s}{'p90 ms':>9s}{'n':>7s}")
    for world_size in (2, 8):
        rows = {"rayguard": report_cost_once(True, world_size, reports, out),
                "plain": report_cost_once(False, world_size, plain_reports, out)}
        for name, took in rows.items():
            print(f"{world_size:6d}{name:>10s}{statistics.median(took) * 1e3:11.3f}"
                  f"{_p(took, 0.9) * 1e3:9.3f}{len(took):7d}", flush=True)
        ratio = statistics.median(rows["plain"]) / statistics.median(rows["rayguard"])
        print(f"{'':6s}plain / rayguard median: {ratio:.0f}x", flush=True)
    print("target: rayguard median < 1 ms")
    print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--observe-only", action="store_true",
                        help="only the step-timing/metrics/straggler cost")
    parser.add_argument("--interval-s", type=float, default=0.5,
                        help="summary interval in the step-timing part (default 0.5: 10x the "
                             "default rate)")
    parser.add_argument("--report-cost-only", action="store_true",
                        help="only the metrics-only report cost at world sizes 2 and 8")
    parser.add_argument("--reports", type=int, default=500)
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
        observe_main(args.reps, args.interval_s)
        return
    if args.report_cost_only:
        report_cost_main(args.reports)
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
    observe_main(args.reps, args.interval_s)
    report_cost_main(args.reports)


if __name__ == "__main__":
    main()
