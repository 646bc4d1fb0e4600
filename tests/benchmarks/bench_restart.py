"""Restart from the memory tier vs from disk (RobustTrainer, 2 CPU workers, ~512 MiB of state).

Each rank saves its own ``--mib-per-rank`` MiB state at every step; rank 1 is killed at step
``KILL_STEP``; the run restarts from the last committed checkpoint. Per mode
(``CheckpointConfig(memory_tier=False)`` = disk, ``True`` = memory), measured in the run:

- restart: seconds from the kill to the first step done after the restart;
- load: seconds inside ``rayguard.train.load_state()`` after the restart (slowest rank; rank
  0 also chooses and, from disk, verifies the whole checkpoint);
- save: median seconds a ``report(state=...)`` blocked the loop, after the first
  ``WARM_STEPS`` (the memory tier adds its copy into the object store here).

The disk files were just written, so the disk path reads them from the page cache: the
favourable case for disk. Target: memory load <= 0.5x disk load.

    .venv/bin/python tests/benchmarks/bench_restart.py [--mib-per-rank 256] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

STEPS, KILL_STEP = 6, 4
WARM_STEPS = 2  # saves before this step include one-time start-up (the node's keeper actor)


def loop(config):
    import torch

    import rayguard

    ctx = rayguard.train.get_context()
    out = config["out"]
    n = config["mib"] * 1024 * 1024 // 4 // 4
    t0 = time.perf_counter()
    state = rayguard.train.load_state()
    load_s = time.perf_counter() - t0
    start = 0
    if state is None:
        gen = torch.Generator().manual_seed(ctx.rank)
        state = {"w": [torch.randn(n, generator=gen) for _ in range(4)], "step": -1}
    else:
        start = state["step"] + 1
        _mark(out, {"what": "load", "rank": ctx.rank, "s": load_s, "attempt": ctx.attempt})
    for step in range(start, STEPS):
        for w in state["w"]:
            w.add_(1.0)
        state["step"] = step
        if step == KILL_STEP and ctx.attempt == 0:
            time.sleep(3)  # the previous checkpoint's memory copies are registered by now
            if ctx.rank == 1:
                _mark(out, {"what": "kill", "time": time.time()})
                os.kill(os.getpid(), 9)
        t0 = time.perf_counter()
        rayguard.train.report({"step": step}, state=state)
        _mark(out, {"what": "save", "rank": ctx.rank, "s": time.perf_counter() - t0,
                    "attempt": ctx.attempt, "step": step})
        if ctx.attempt > 0 and step == start and ctx.rank == 0:
            _mark(out, {"what": "first_step", "time": time.time()})


def _mark(out: str, row: dict) -> None:
    with open(os.path.join(out, "marks.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def run_once(memory: bool, mib: int, root: str) -> dict:
    from ray.train import RunConfig, ScalingConfig

    import rayguard
    from rayguard.events import read as read_events

    name = f"{'memory' if memory else 'disk'}-{time.time_ns()}"
    out = os.path.join(root, name + "-marks")
    os.makedirs(out)
    trainer = rayguard.RobustTrainer(
        loop, train_loop_config={"out": out, "mib": mib},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=root, name=name),
        guard_config=rayguard.GuardConfig(
            numa="off", progress_interval_s=None,
            checkpoint=rayguard.CheckpointConfig(memory_tier=memory)))
    result = trainer.fit()
    with open(os.path.join(out, "marks.jsonl")) as f:
        marks = [json.loads(line) for line in f]
    restored = [e for e in read_events(result.path) if e["kind"] == "restored"]
    kill = next(m["time"] for m in marks if m["what"] == "kill")
    first = next(m["time"] for m in marks if m["what"] == "first_step")
    loads = [m["s"] for m in marks if m["what"] == "load"]
    saves = [m["s"] for m in marks if m["what"] == "save" and m["attempt"] == 0
             and m["step"] >= WARM_STEPS]
    return {"restart_s": first - kill, "load_s": max(loads), "save_s": statistics.median(saves),
            "tier": restored[0].get("tier") if restored else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib-per-rank", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    rows: dict[str, list[dict]] = {"disk": [], "memory": []}
    with tempfile.TemporaryDirectory(prefix="rg-bench-restart-") as root:
        for _ in range(args.repeats):
            for mode in ("disk", "memory"):
                row = run_once(mode == "memory", args.mib_per_rank, root)
                rows[mode].append(row)
                print(f"{mode:6s} restart {row['restart_s']:.2f} s  load {row['load_s']:.3f} s  "
                      f"save {row['save_s']:.3f} s  (restored from {row['tier']})", flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("restart_s", "load_s", "save_s")}
           for m, rs in rows.items()}
    print(f"\nstate: 2 ranks x {args.mib_per_rank} MiB; medians of {args.repeats} run(s) per mode")
    for key, what in (("restart_s", "kill -> first step after restart"),
                      ("load_s", "load_state() after restart (slowest rank)"),
                      ("save_s", "report(state=) blocked per checkpoint")):
        d, m = med["disk"][key], med["memory"][key]
        print(f"{what:45s} disk {d:7.3f} s  memory {m:7.3f} s  memory/disk {m / d:.2f}x")
    ratio = med["memory"]["load_s"] / med["disk"]["load_s"]
    print(f"target: memory load <= 0.5x disk load: {'met' if ratio <= 0.5 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
