"""Goodput (ETTR) of one job under one fault schedule: plain TorchTrainer vs RobustTrainer.

The same loop (a small model with ``--state-mib`` of state, ``--step-s`` of work a step, a
checkpoint every ``--every`` steps) and the same fault schedule (each optional: rank 1
killed at each step of ``--kills``, hung at ``--hang``, a NaN loss at ``--nan``, a
preemption SIGTERM to rank 1 at ``--preempt``; each fires once per run) run under:

- ``torch``: plain ``ray.train.torch.TorchTrainer`` with user checkpoints
  (``ray.train.report(checkpoint=...)``, ``torch.save``) and ``FailureConfig(max_failures)``;
  the loop itself kills, sleeps ``--stall-timeout-s`` then raises for the hang (the same
  detection time as rayguard's watchdog: a plain run has none), raises on the NaN (a loop
  checking its loss), and a SIGTERM ends the worker;
- ``sync``, ``async``, ``memory``: ``rayguard.RobustTrainer`` with ``CheckpointConfig(mode=
  "sync")``, ``mode="async"`` and ``memory_tier=True``; the kill, the hang and the NaN are
  injected by ``GuardConfig(faults=...)`` (so the events record the step of each fault);
- ``paced``: RobustTrainer (sync) whose loop checkpoints when ``should_checkpoint()`` says
  (the Young/Daly interval), not every ``--every`` steps;
- ``live``, ``live-memory``: RobustTrainer (sync; with the memory tier) with
  ``GuardConfig(recovery="live")``: a killed rank is replaced alone and rank 0 keeps its
  process ("rank 0 processes" counts the processes rank 0's steps ran in); ``live-nospare``:
  ``live`` with ``HealthConfig(live_spare=False)`` (a replacement starts a new process);

each also without faults (``--no-clean``: not). The benchmark measures each run itself,
from the loop's own marks (rank 0): productive time is the time of each step done for the
first time (a step run again after a restore is replayed), less the time its report blocked
on a checkpoint; ETTR = productive time / the driver's wall time of ``fit()`` (the
definition the product's figure is checked against: a report's own time outside a
checkpoint counts with its step); "ETTR, work only" leaves every report's time out (plain
TorchTrainer's reports wait on its controller's poll). Per fault, the cost is the time
from the fault to the first new step of the next worker group. For RobustTrainer it
also prints the product's own figure (``RobustTrainer.last_goodput``, from the event log:
``rayguard events RUN --goodput``) with its badput by cause, and checks that the product's
ratio equals the benchmark's within 5%.

``--interval-check``: the checkpoint interval on a real run. Rank 1 is killed every
``--kill-every-s`` seconds of wall time; a ``paced`` run (prior ``mtbf_s`` of
``--prior-factor`` times the truth) and three fixed intervals (``--factors``: 1/2, 1 and 2
times Daly's optimum for the paced run's measured cost) run the same loop, each
``--repeats`` times in a rotated order; it prints the interval the paced run chose against
Daly's optimum (within 20%?) and its median goodput against the best fixed interval's.

    .venv/bin/python tests/benchmarks/bench_goodput.py --quick
    .venv/bin/python tests/benchmarks/bench_goodput.py [--modes torch,sync,async,memory,paced]
    .venv/bin/python tests/benchmarks/bench_goodput.py --long --modes torch,sync,live,live-memory
    .venv/bin/python tests/benchmarks/bench_goodput.py --interval-check

Per fault it prints its cost (to the first new step) and the time to the next step completed
(a replayed one too: what live recovery's target counts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

MARKS = "marks.jsonl"
MODES = ("torch", "sync", "async", "memory", "paced", "live", "live-memory", "live-nospare")


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
        rank, attempt = ray.train.get_context().get_world_rank(), os.getpid()  # a new group
        ckpt = ray.train.get_checkpoint()
        state = None
        if ckpt is not None:
            with ckpt.as_directory() as d:
                state = torch.load(os.path.join(d, "state.pt"))
    model = torch.nn.Linear(64, 64)
    ballast = torch.zeros(int(config["state_mib"] * 2**18))  # float32: 4 bytes each
    if state is not None:
        model.load_state_dict(state["model"])
    start = 0 if state is None else state["step"] + 1
    out, every = config["out"], config["every"]
    for step in range(start, config["steps"]):
        t0 = time.time()
        loss = _work(model, config["step_s"])
        if rank == 1:
            _timed_kill(config)
        fault = _fault(config, rank, step)
        if fault is not None and not robust:
            loss = _plain_fault(fault, config, loss)
        if fault == "preempt":
            import signal

            os.kill(os.getpid(), signal.SIGTERM)  # rayguard holds it until a checkpoint
        save = not config["paced"] and every > 0 and step % every == every - 1
        t1 = time.time()
        metrics = {"step": step, "loss": loss}
        if robust:
            save = save or rayguard.train.should_checkpoint()
            rayguard.train.report(metrics, state={"model": model.state_dict(), "step": step,
                                                  "ballast": ballast} if save else None)
        else:
            _plain_report(model, ballast, metrics, save, rank)
        t2 = time.time()
        if rank == 0:
            _mark(out, {"what": "step", "step": step, "start": t0, "end": t2, "work": t1 - t0,
                        "blocked": (t2 - t1) if save else 0.0, "attempt": attempt,
                        "pid": os.getpid()})


def _work(model, seconds):
    import torch

    end = time.perf_counter() + seconds
    x = torch.randn(32, 64)
    loss = 0.0
    while time.perf_counter() < end:
        out = model(x).pow(2).mean()
        out.backward()
        loss = float(out.detach())
    return loss


def _fault(config, rank, step):
    """The fault scheduled for this rank at this step, the first time it is reached (marked:
    the benchmark's own record of when it came); ``None`` otherwise."""
    for kind, at, on in (("kill", config["kills"], 1), ("hang", [config["hang"]], 1),
                         ("nan", [config["nan"]], 0), ("preempt", [config["preempt"]], 1)):
        if rank == on and step in at and not _done(config["out"], f"{kind}-{step}"):
            _mark(config["out"], {"what": "fault", "kind": kind, "step": step,
                                  "time": time.time()})
            return kind
    return None


def _plain_fault(kind, config, loss):
    """A fault in the plain loop, done by the loop itself."""
    if kind == "kill":
        os.kill(os.getpid(), 9)
    if kind == "hang":  # no watchdog: charged the same detection time, then ended
        time.sleep(config["stall_timeout_s"])
        raise RuntimeError("hung step ended by the loop's own timeout")
    if kind == "nan":
        raise FloatingPointError("loss is NaN (the loop checks its loss)")
    return loss


def _timed_kill(config):
    """``--interval-check``: kill this worker at every ``kill_every_s`` of wall time."""
    every = config.get("kill_every_s")
    if not every:
        return
    n = int((time.time() - config["t_start"]) // every)
    if n >= 1 and not _done(config["out"], f"timed-{n}"):
        _mark(config["out"], {"what": "fault", "kind": "kill", "step": -1, "time": time.time()})
        os.kill(os.getpid(), 9)


def _plain_report(model, ballast, metrics, save, rank):
    import ray.train
    import torch

    if not save:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        if rank == 0:
            torch.save({"model": model.state_dict(), "step": metrics["step"],
                        "ballast": ballast}, os.path.join(d, "state.pt"))
        ray.train.report(metrics,
                         checkpoint=ray.train.Checkpoint.from_directory(d) if rank == 0 else None)


def _done(out, key):
    """True if ``key`` was claimed before (the first call claims it)."""
    try:
        os.close(os.open(os.path.join(out, f"done-{key}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return True
    return False


def _mark(out, row):
    with open(os.path.join(out, MARKS), "a") as f:
        f.write(json.dumps(row) + "\n")


def measure(marks, wall_s):
    """ETTR from the loop's marks: new steps' time (less checkpoint blocking) / wall; and
    ``work``: new steps' own work only (before their report), the report's time left out.
    A fault's cost: the fault to the first new step of the next attempt (worker group); its
    ``next``: the fault to the next step completed (a replayed one too)."""
    steps = sorted((m for m in marks if m["what"] == "step"), key=lambda m: m["end"])
    best, productive, work, new_at = -1, 0.0, 0.0, []
    for m in steps:
        if m["step"] > best:
            productive += max(m["end"] - m["start"] - m["blocked"], 0.0)
            work += m.get("work", 0.0)
            best = m["step"]
            new_at.append((m["start"], m["attempt"]))
    costs, nexts = [], []
    for k in sorted((m for m in marks if m["what"] == "fault"), key=lambda m: m["time"]):
        before = [m["attempt"] for m in steps if m["end"] <= k["time"]]
        group = before[-1] if before else None
        later = [t for t, a in new_at if t > k["time"] and a != group]
        costs.append((k["kind"], later[0] - k["time"] if later else None))
        done = [m["end"] for m in steps if m["end"] > k["time"] and m["attempt"] != group]
        nexts.append((k["kind"], done[0] - k["time"] if done else None))
    pids = sorted({m["pid"] for m in steps if "pid" in m})
    return {"ettr": productive / wall_s, "productive_s": productive, "wall_s": wall_s,
            "work_ettr": work / wall_s, "fault_costs_s": costs, "fault_next_s": nexts,
            "rank0_pids": len(pids)}


def fault_spec(args):
    """``GuardConfig(faults=...)`` for the kill, the hang and the NaN (rayguard's injector)."""
    parts = [f"kill:rank=1,step={k}" for k in args.kills]
    parts += [f"hang:rank=1,step={args.hang}"] if args.hang >= 0 else []
    parts += [f"nan:rank=0,step={args.nan}"] if args.nan >= 0 else []
    return ";".join(parts) or None


def run_once(mode, args, root, *, faults=True, every=None, extra=None):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    import rayguard

    name = f"{mode}-{time.time_ns()}"
    out = os.path.join(root, name + "-marks")
    os.makedirs(out)
    config = {"out": out, "steps": args.steps, "every": args.every if every is None else every,
              "step_s": args.step_s, "kills": args.kills if faults else [],
              "hang": args.hang if faults else -1, "nan": args.nan if faults else -1,
              "preempt": args.preempt if faults else -1, "robust": mode != "torch",
              "paced": mode == "paced", "state_mib": args.state_mib,
              "stall_timeout_s": args.stall_timeout_s, "t_start": time.time(), **(extra or {})}
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    if mode == "torch":
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(loop, train_loop_config=config, scaling_config=scaling,
                               run_config=RunConfig(storage_path=root, name=name,
                                                    failure_config=FailureConfig(max_failures=20)))
    else:
        ckpt = rayguard.CheckpointConfig(
            mode="async" if mode == "async" else "sync",
            memory_tier=mode in ("memory", "live-memory"),
            interval=mode == "paced", min_interval_s=args.min_interval_s,
            max_interval_s=600.0, mtbf_s=args.mtbf_s)
        health = rayguard.HealthConfig(stall_timeout_s=args.stall_timeout_s, max_restarts=20,
                                       live_spare=mode != "live-nospare", live_spare_after_s=0)
        trainer = rayguard.RobustTrainer(
            loop, train_loop_config=config, scaling_config=scaling,
            run_config=RunConfig(storage_path=root, name=name),
            guard_config=rayguard.GuardConfig(numa="off", progress_interval_s=None,
                                              recovery="live" if mode.startswith("live")
                                              else "restart",
                                              checkpoint=ckpt, health=health,
                                              faults=fault_spec(args) if faults else None))
    t0 = time.time()
    failed = None
    try:
        trainer.fit()
    except Exception as exc:  # a run that never finishes (its interval outlasts every
        failed = f"{type(exc).__name__}"  # attempt: no checkpoint, then the restart budget)
    wall = time.time() - t0
    with open(os.path.join(out, MARKS)) as f:
        row = measure([json.loads(line) for line in f], wall)
    row["failed"] = failed
    row["product"] = getattr(trainer, "last_goodput", None)
    row["run_dir"] = os.path.join(root, name)
    return row


def _cell(value, fmt="{:.3f}"):
    return "-" if value is None else fmt.format(value)


def table(rows):
    """The runs side by side: a column per run, a row per figure."""
    from rayguard.observe.goodput import CAUSES, RESTART_PHASES

    names = list(rows)
    lines = [("", names)]
    get = {name: rows[name].get("product") for name in names}
    lines.append(("ETTR (benchmark)", [_cell(rows[n]["ettr"]) for n in names]))
    lines.append(("ETTR, work only", [_cell(rows[n]["work_ettr"]) for n in names]))
    lines.append(("goodput (product)", [_cell(get[n] and get[n].ratio) for n in names]))
    lines.append(("apart %", [_cell(rows[n].get("gap"), "{:.1%}") for n in names]))
    lines.append(("wall s (fit)", [_cell(rows[n]["wall_s"], "{:.1f}") for n in names]))
    lines.append(("wall s (product)", [_cell(get[n] and get[n].wall_s, "{:.1f}") for n in names]))
    lines.append(("productive s", [_cell(rows[n]["productive_s"], "{:.1f}") for n in names]))
    lines.append(("rank 0 processes", [str(rows[n]["rank0_pids"]) for n in names]))
    lines.append(("productive s (prod.)",
                  [_cell(get[n] and get[n].productive_s, "{:.1f}") for n in names]))
    kinds = sorted({k for n in names for k, _ in rows[n]["fault_costs_s"]})
    for kind in kinds:
        lines.append((f"cost of {kind} s", [", ".join(
            _cell(c, "{:.1f}") for k, c in rows[n]["fault_costs_s"] if k == kind) or "-"
            for n in names]))
        lines.append((f"{kind} to next step s", [", ".join(
            _cell(c, "{:.1f}") for k, c in rows[n].get("fault_next_s", []) if k == kind) or "-"
            for n in names]))
    for cause in CAUSES:
        lines.append((f"badput {cause} s", [_cell(get[n] and get[n].badput_s[cause], "{:.1f}")
                                            for n in names]))
    for phase in RESTART_PHASES:
        lines.append((f"  restart {phase} s", [_cell(get[n] and get[n].restart_s[phase],
                                                     "{:.1f}") for n in names]))
    width = max(9, *(len(n) for n in names))
    for label, cells in lines:
        print(f"{label:22s}" + "".join(f"{c:>{width + 1}s}" for c in cells), flush=True)


def compare(rows):
    """Each RobustTrainer run's product figure against the measurement; the misses."""
    misses = []
    for name, row in rows.items():
        g = row.get("product")
        if g is None or g.ratio is None:
            continue
        row["gap"] = abs(g.ratio - row["ettr"]) / row["ettr"]
        misses += [name] if row["gap"] > 0.05 else []
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="default 44 (--quick: 30, --interval-check: 400)")
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--state-mib", type=float, default=None,
                        help="default 8 (--interval-check: 64)")
    parser.add_argument("--kills", default="12", help="steps at which rank 1 is killed")
    parser.add_argument("--hang", type=int, default=20, help="step rank 1 hangs at (-1: none)")
    parser.add_argument("--nan", type=int, default=28, help="step of a NaN loss (-1: none)")
    parser.add_argument("--preempt", type=int, default=36,
                        help="step rank 1 gets SIGTERM at (-1: none)")
    parser.add_argument("--stall-timeout-s", type=float, default=5.0)
    parser.add_argument("--min-interval-s", type=float, default=0.5)
    parser.add_argument("--mtbf-s", type=float, default=30.0,
                        help="CheckpointConfig(mtbf_s=) of the paced mode")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-clean", action="store_true", help="no fault-free runs")
    parser.add_argument("--quick", action="store_true",
                        help="iteration: sync only, 30 steps, one kill, no hang/NaN/preempt, "
                             "no fault-free run")
    parser.add_argument("--long", action="store_true",
                        help="the goodput issue's job: 400 steps of 50 ms, 64 MiB of state, a "
                             "checkpoint every 25 steps, rank 1 killed at steps 130 and 270, "
                             "no hang, NaN or preemption (the live modes' spare is warm by then)")
    parser.add_argument("--interval-check", action="store_true")
    parser.add_argument("--keep", default=None, help="keep the runs (event logs) under DIR")
    parser.add_argument("--kill-every-s", type=float, default=20.0)
    parser.add_argument("--prior-factor", type=float, default=4.0)
    parser.add_argument("--factors", default="0.5,1,2",
                        help="--interval-check: the fixed intervals, times Daly's optimum")
    parser.add_argument("--repeats", type=int, default=1,
                        help="--interval-check: runs of each, in a rotated order (medians)")
    args = parser.parse_args()
    if args.long:
        args.steps, args.step_s, args.state_mib, args.every = 400, 0.05, 64.0, 25
        args.kills, args.hang, args.nan, args.preempt = "130,270", -1, -1, -1
    if args.quick:
        args.kills, args.hang, args.nan, args.preempt = "12", -1, -1, -1
        args.modes, args.no_clean = "sync", True
    big = args.interval_check
    args.steps = args.steps or (400 if big else 30 if args.quick else 44)
    args.state_mib = args.state_mib if args.state_mib is not None else 64.0 if big else 8.0
    args.kills = [int(k) for k in args.kills.split(",") if k]
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    keep = args.keep and contextlib.nullcontext(tempfile.mkdtemp(prefix="rg-bench-goodput-",
                                                                  dir=args.keep))
    with keep or tempfile.TemporaryDirectory(prefix="rg-bench-goodput-") as root:
        if args.interval_check:
            from bench_goodput_interval import interval_check  # beside this file

            interval_check(args, root, run_once)
            return
        rows = {}
        for mode in args.modes.split(","):
            rows[mode] = run_once(mode, args, root)
            if not args.no_clean:
                rows[f"{mode}/clean"] = run_once(mode, args, root, faults=False)
        misses = compare(rows)
        table(rows)
    print("product's goodput matches the measurement within 5%: "
          + ("yes" if not misses else f"NO ({', '.join(misses)})"))


if __name__ == "__main__":
    main()
