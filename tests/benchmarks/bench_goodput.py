"""Goodput (ETTR) of one job under one fault schedule: plain TorchTrainer vs RobustTrainer.

The same loop (a small model, ``--step-s`` of work a step, a checkpoint every
``--every`` steps) and the same fault schedule (rank 1 killed at each step of ``--kills``,
once each) run under:

- ``torch``: plain ``ray.train.torch.TorchTrainer`` with user checkpoints
  (``ray.train.report(checkpoint=...)``, ``torch.save``) and ``FailureConfig(max_failures)``;
- ``sync``, ``async``, ``memory``: ``rayguard.RobustTrainer`` with
  ``CheckpointConfig(mode="sync")``, ``mode="async"`` and ``memory_tier=True``.

The benchmark measures each run itself, from the loop's own marks (rank 0): productive time
is the time of each step done for the first time (a step run again after a restore is
replayed), less the time its report blocked on a checkpoint; ETTR = productive time / the
driver's wall time of ``fit()``. Per fault, the cost is the time from the kill to the next
new step. For RobustTrainer it also prints the product's own figure
(``RobustTrainer.last_goodput``, from the event log: ``rayguard events RUN --goodput``) with
its badput by cause, and checks that the product's ratio equals the benchmark's within 5%.

    .venv/bin/python tests/benchmarks/bench_goodput.py [--steps 40] [--kills 12,27]
        [--modes torch,sync,async,memory]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

MARKS = "marks.jsonl"


def loop(config):
    import ray.train
    import torch

    robust = config["robust"]
    if robust:
        import rayguard

        ctx = rayguard.train.get_context()
        rank, attempt = ctx.rank, ctx.attempt
        state = rayguard.train.load_state()
    else:
        rank, attempt = ray.train.get_context().get_world_rank(), None
        ckpt = ray.train.get_checkpoint()
        state = None
        if ckpt is not None:
            with ckpt.as_directory() as d:
                state = torch.load(os.path.join(d, "state.pt"))
    model = torch.nn.Linear(64, 64)
    if state is not None:
        model.load_state_dict(state["model"])
    start = 0 if state is None else state["step"] + 1
    out = config["out"]
    for step in range(start, config["steps"]):
        t0 = time.time()
        _work(model, config["step_s"])
        if rank == 1 and step in config["kills"] and not _done(out, step):
            _mark(out, {"what": "kill", "step": step, "time": time.time()})
            open(os.path.join(out, f"killed-{step}"), "w").close()
            os.kill(os.getpid(), 9)
        save = step % config["every"] == config["every"] - 1
        t1 = time.time()
        if robust:
            state = {"model": model.state_dict(), "step": step} if save else None
            rayguard.train.report({"step": step}, state=state)
        else:
            _plain_report(model, step, save, rank)
        t2 = time.time()
        if rank == 0:
            _mark(out, {"what": "step", "step": step, "start": t0, "end": t2,
                        "blocked": (t2 - t1) if save else 0.0, "attempt": attempt})


def _work(model, seconds):
    import torch

    end = time.perf_counter() + seconds
    x = torch.randn(32, 64)
    while time.perf_counter() < end:
        model(x).sum().backward()


def _plain_report(model, step, save, rank):
    import ray.train
    import torch

    if not save:
        ray.train.report({"step": step})
        return
    with tempfile.TemporaryDirectory() as d:
        if rank == 0:
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(d, "state.pt"))
        ray.train.report({"step": step},
                         checkpoint=ray.train.Checkpoint.from_directory(d) if rank == 0 else None)


def _done(out, step):
    return os.path.exists(os.path.join(out, f"killed-{step}"))


def _mark(out, row):
    with open(os.path.join(out, MARKS), "a") as f:
        f.write(json.dumps(row) + "\n")


def measure(marks, wall_s):
    """ETTR from the loop's marks: new steps' time (less checkpoint blocking) / wall."""
    steps = sorted((m for m in marks if m["what"] == "step"), key=lambda m: m["end"])
    best, productive, new_at = -1, 0.0, []
    for m in steps:
        if m["step"] > best:
            productive += max(m["end"] - m["start"] - m["blocked"], 0.0)
            best = m["step"]
            new_at.append((m["start"], m["step"]))
    costs = []
    for k in (m for m in marks if m["what"] == "kill"):
        later = [t for t, s in new_at if t > k["time"] and s > k["step"] - 1]
        costs.append(later[0] - k["time"] if later else None)
    return {"ettr": productive / wall_s, "productive_s": productive, "wall_s": wall_s,
            "fault_costs_s": costs}


def run_once(mode, args, root):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    import rayguard

    name = f"{mode}-{time.time_ns()}"
    out = os.path.join(root, name + "-marks")
    os.makedirs(out)
    config = {"out": out, "steps": args.steps, "every": args.every, "step_s": args.step_s,
              "kills": args.kills, "robust": mode != "torch"}
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    if mode == "torch":
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(loop, train_loop_config=config, scaling_config=scaling,
                               run_config=RunConfig(storage_path=root, name=name,
                                                    failure_config=FailureConfig(max_failures=5)))
    else:
        ckpt = rayguard.CheckpointConfig(mode="async" if mode == "async" else "sync",
                                         memory_tier=mode == "memory")
        trainer = rayguard.RobustTrainer(
            loop, train_loop_config=config, scaling_config=scaling,
            run_config=RunConfig(storage_path=root, name=name),
            guard_config=rayguard.GuardConfig(numa="off", progress_interval_s=None,
                                              checkpoint=ckpt))
    t0 = time.time()
    trainer.fit()
    wall = time.time() - t0
    with open(os.path.join(out, MARKS)) as f:
        row = measure([json.loads(line) for line in f], wall)
    row["product"] = getattr(trainer, "last_goodput", None)
    return row


def _print(mode, row):
    costs = ", ".join("-" if c is None else f"{c:.1f} s" for c in row["fault_costs_s"])
    print(f"{mode:7s} ETTR {row['ettr']:.3f}  wall {row['wall_s']:6.1f} s  productive "
          f"{row['productive_s']:6.1f} s  per fault: {costs}", flush=True)
    g = row["product"]
    if g is None:
        return None
    causes = "  ".join(f"{c} {s:.1f}" for c, s in g.badput_s.items() if s > 0)
    phases = "  ".join(f"{p} {s:.1f}" for p, s in g.restart_s.items() if s > 0)
    print(f"        product: goodput {g.ratio:.3f} (wall {g.wall_s:.1f} s)  badput s: {causes}"
          f"\n        restart phases s: {phases}", flush=True)
    return abs(g.ratio - row["ettr"]) / row["ettr"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--kills", default="12,27", help="steps at which rank 1 is killed")
    parser.add_argument("--modes", default="torch,sync,async,memory")
    args = parser.parse_args()
    args.kills = [int(k) for k in args.kills.split(",") if k]
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    misses = []
    with tempfile.TemporaryDirectory(prefix="rg-bench-goodput-") as root:
        for mode in args.modes.split(","):
            gap = _print(mode, run_once(mode, args, root))
            if gap is not None:
                print(f"        product vs benchmark: {100 * gap:.1f}% apart "
                      f"({'within' if gap <= 0.05 else 'NOT within'} 5%)", flush=True)
                misses += [mode] if gap > 0.05 else []
    print("product's goodput matches the measurement within 5%: "
          + ("yes" if not misses else f"NO ({', '.join(misses)})"))


if __name__ == "__main__":
    main()
