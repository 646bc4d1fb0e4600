"""Elastic training benchmark: the planners at 4096 ranks, and node loss -> first step at the new size.

    .venv/bin/python tests/benchmarks/bench_elastic.py                  # planners + one resize trial each
    .venv/bin/python tests/benchmarks/bench_elastic.py --modes live     # RobustTrainer under live only
    .venv/bin/python tests/benchmarks/bench_elastic.py --quick          # planners only

1. Planners on a simulated 4096-rank, 512-node world (8 GPUs per node): the initial rank
   assignment, the remap after 37 nodes are lost and 20 join, and ``valid_world_sizes`` over
   [1, 4096]. Baseline: Ray Train's own rank ordering
   (``WorkerGroup._sort_workers_by_gpu_id_grouped_by_node``) of the same 4096 workers, which
   assigns fresh ranks and keeps no mapping. Target: remap + valid sizes < 50 ms.
2. Resize: a 3-node (``--nodes 2``: 2-node) simulated cluster (one CPU, one worker per
   node), elastic (1, nodes); a node is removed mid-run and later added back. Reported:
   seconds from the removal to the first completed step on one worker fewer, and from the
   addition to the first step on all of them again, for plain
   ``TorchTrainer`` (the baseline) and for ``rayguard.RobustTrainer`` (same loop, a checkpoint
   every step) under each of ``--modes`` (``GuardConfig(recovery=)``, default both):
   ``restart`` restarts the worker group at each resize, ``live`` resizes it in place. Also
   reported: how many processes rank 0 ran in over the run (1 when every resize kept it),
   each in-place resize's phases (the controller's and each rank's), and whether the final
   model of ``live`` is bitwise the one of ``restart``: the loop trains a small model whose
   step is the same arithmetic at the same world size, and every trainer resizes at the same
   steps (the world waits at step 4 until the node is removed, at step 8 until it is added).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")

MODES = ("restart", "live")
"""``GuardConfig(recovery=)`` modes a resize trial of ``RobustTrainer`` runs under."""


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench_planners(reps: int) -> None:
    from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup

    from rayguard.elastic import WorkerSlot, plan_ranks, valid_world_sizes

    nodes, per_node = 512, 8
    slots = [WorkerSlot(f"node{n:04d}", g, (g,)) for n in range(nodes) for g in range(per_node)]
    first = plan_ranks(slots)
    lost = {f"node{n:04d}" for n in range(0, nodes, 14)}  # 37 nodes
    joined = [WorkerSlot(f"new{n:03d}", g, (g,)) for n in range(20) for g in range(per_node)]
    after = [s for s in slots if s.node_id not in lost] + joined
    fake = [SimpleNamespace(metadata=SimpleNamespace(node_id=s.node_id, accelerator_ids={"GPU": [str(g) for g in s.gpu_ids]}))
            for s in slots]

    t_ray = median_ms(lambda: WorkerGroup._sort_workers_by_gpu_id_grouped_by_node(fake), reps)
    t_init = median_ms(lambda: plan_ranks(slots), reps)
    t_remap = median_ms(lambda: plan_ranks(after, first.ranks), reps)
    t_valid = median_ms(lambda: valid_world_sizes(4096 * 8 * 6, 8, 1, 4096), reps)
    t_naive = median_ms(lambda: [w for w in range(1, 4097) if (4096 * 8 * 6) % (8 * w) == 0], reps)
    print(f"planners, 4096 ranks on 512 nodes (median of {reps}):")
    print(f"  Ray rank ordering (baseline, no mapping)   {t_ray:8.2f} ms")
    print(f"  plan_ranks, first attempt                  {t_init:8.2f} ms  ({t_init / t_ray:.1f}x Ray's ordering)")
    print(f"  plan_ranks, remap -37 nodes +20 nodes      {t_remap:8.2f} ms  ({t_remap / t_ray:.1f}x)")
    print(f"  valid_world_sizes [1, 4096]                {t_valid:8.3f} ms  (scan of the range: {t_naive:.3f} ms)")
    total = t_remap + t_valid
    print(f"  remap + valid sizes                        {total:8.2f} ms  target < 50 ms: {'met' if total < 50 else 'MISSED'}")


# ------------------------------------------------------------------------------------------
# Resize trial
# ------------------------------------------------------------------------------------------
def _log_step(out: str, ws: int, rank: int, step: int) -> None:
    with open(os.path.join(out, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "ws": ws, "rank": rank, "pid": os.getpid(),
                            "step": step}) + "\n")


SHRINK_AT, GROW_AT = 4, 8
"""The resize schedule: after committing step 4 the full world waits there until a node is
removed, after step 8 the smaller one until a node is added, so every trainer resizes at the
same steps and the final models compare."""
STOP = 12
GLOBAL = 6


def _hold(config: dict, step: int, ws: int, rank: int, beat: Callable[[], None]) -> None:
    """At a scheduled step, wait (feeding the watchdog) until the group is resized: in place,
    ``beat`` raises at the resize notice; on a restart, the process is ended."""
    if {SHRINK_AT: config["nodes"], GROW_AT: config["nodes"] - 1}.get(step) != ws:
        return
    open(os.path.join(config["out"], f"held-{step}-{ws}-{rank}"), "w").close()
    deadline = time.time() + 180
    while time.time() < deadline:
        beat()
        time.sleep(0.1)


def _held(out: str, step: int, ws: int) -> bool:
    return len(glob.glob(os.path.join(out, f"held-{step}-{ws}-*"))) >= ws


def plain_loop(config: dict) -> None:
    import ray.train
    from ray.train import Checkpoint

    ctx = ray.train.get_context()
    ws, rank = ctx.get_world_size(), ctx.get_world_rank()
    step = 0
    ck = ray.train.get_checkpoint()
    if ck:
        with ck.as_directory() as d, open(os.path.join(d, "s.json")) as f:
            step = json.load(f)["step"]
    while step < STOP:
        _hold(config, step, ws, rank, lambda: None)
        time.sleep(config["step_s"])
        step += 1
        _log_step(config["out"], ws, rank, step)
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "s.json"), "w") as f:
                    json.dump({"step": step}, f)
                ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report({"step": step})


def _train_step(model: Any, opt: Any, step: int, rank: int, ws: int) -> None:
    """One optimizer step on the global batch of ``step`` (ids ``step*GLOBAL`` on), this
    rank's share of it in micro-batches of one, the gradient summed over the ranks: the same
    arithmetic on every trainer at the same world size."""
    import torch
    import torch.distributed as dist

    per = GLOBAL // ws
    for i in range(step * GLOBAL + rank * per, step * GLOBAL + (rank + 1) * per):
        x = torch.tensor([[i % 7, i % 5, i % 3, 1.0]])
        ((model(x) - (i % 11) / 10.0) ** 2).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= GLOBAL
    opt.step()
    opt.zero_grad()


def guarded_loop(config: dict) -> None:
    import hashlib

    import torch

    import rayguard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = rayguard.train.load_state()
    step = 0
    if state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    while step < STOP:
        _hold(config, step, ctx.world_size, ctx.rank, rayguard.train.heartbeat)
        time.sleep(config["step_s"])
        step += 1
        _train_step(model, opt, step, ctx.rank, ctx.world_size)
        _log_step(config["out"], ctx.world_size, ctx.rank, step)
        rayguard.train.report({"step": step}, step=step, state={
            "model": model.state_dict(), "opt": opt.state_dict(), "step": step}
            if ctx.rank == 0 else None)
    if ctx.rank == 0:
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values()))
        with open(os.path.join(config["out"], "model.sha256"), "w") as f:
            f.write(digest.hexdigest())


def _events(out: str) -> list[dict]:
    rows = []
    for path in glob.glob(os.path.join(out, "*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.endswith("\n")]
    return rows


def _phases(result: Any) -> None:
    """Print each in-place resize's phases (the controller's and each rank's)."""
    from rayguard.events import events_path
    from rayguard.events import read as read_events

    try:
        events = read_events(str(events_path(result.path)))
    except Exception as exc:  # a plain Ray run has no event log
        print(f"    (no rayguard event log: {exc})")
        return
    for e in events:
        if e["kind"] == "resize":
            phases = {k: round(v, 2) for k, v in (e.get("phases") or {}).items()}
            print(f"    resize {e.get('direction')} {e.get('old_world_size')}->"
                  f"{e.get('new_world_size')} path={e.get('path')} controller phases {phases}"
                  + (f" fallback: {e['fallback']}" if e.get("fallback") else ""))
        elif e["kind"] == "rejoined":
            phases = {k: round(v, 2) for k, v in (e.get("phases") or {}).items()}
            print(f"      rank {e.get('rank')} attempt {e.get('attempt')}"
                  f"{' (new worker)' if e.get('replacement') else ''}: {phases}")


def resize_trial(kind: str, nodes: int = 3, step_s: float = 0.3) -> tuple[float, float, int, str]:
    """One removal and one addition. ``kind``: ``"ray"`` (plain ``TorchTrainer``) or one of
    :data:`MODES` (``RobustTrainer`` under that ``GuardConfig(recovery=)``). Returns the
    seconds from the removal to the first step on 2 workers, from the addition to the first
    step on 3, the number of processes rank 0 ran in, and the final model's digest. ``nodes``:
    the cluster's worker nodes (2 or 3), one worker each."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import rayguard
    from rayguard.testing.cluster import SimulatedCluster, wait_for

    root = tempfile.mkdtemp(prefix=f"bench-elastic-{kind}-")
    out = os.path.join(root, "steps")
    os.makedirs(out)
    config = {"out": out, "step_s": step_s, "nodes": nodes}
    scaling = ScalingConfig(num_workers=(1, nodes), resources_per_worker={"CPU": 1},
                            elastic_resize_monitor_interval_s=1.0)
    run = RunConfig(storage_path=root, name=kind, failure_config=FailureConfig(max_failures=-1))
    with SimulatedCluster(worker_nodes=nodes) as cluster:
        if kind == "ray":
            os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.05")  # same poll as rayguard
            trainer: Any = TorchTrainer(plain_loop, train_loop_config=config, scaling_config=scaling, run_config=run)
        else:
            trainer = rayguard.RobustTrainer(guarded_loop, train_loop_config=config, scaling_config=scaling,
                                             run_config=run, guard_config=rayguard.GuardConfig(
                                                 global_batch_size=GLOBAL, micro_batch_size=1,
                                                 recovery=kind))
        thread = cluster.fit_in_background(trainer)

        def first_step(ws: int, after: float) -> float | None:
            ts = [e["t"] for e in _events(out) if e["ws"] == ws and e["t"] > after]
            return min(ts) if ts else None

        wait_for(lambda: _held(out, SHRINK_AT, nodes), timeout_s=240, what=f"{nodes} workers at step 4")
        t_remove = time.time()
        cluster.remove_worker_node()
        t_shrunk = wait_for(lambda: first_step(nodes - 1, t_remove), timeout_s=240,
                            what="first step on one worker fewer")
        wait_for(lambda: _held(out, GROW_AT, nodes - 1), timeout_s=240, what="the smaller world at step 8")
        t_add = time.time()
        cluster.add_worker_node()
        t_grown = wait_for(lambda: first_step(nodes, t_add), timeout_s=240, what="first step on all workers")
        result = cluster.join(thread, timeout_s=120)
    _phases(result)
    rank0_pids = {e["pid"] for e in _events(out) if e["rank"] == 0}
    digest = ""
    if os.path.exists(os.path.join(out, "model.sha256")):
        with open(os.path.join(out, "model.sha256")) as f:
            digest = f.read()
    return t_shrunk - t_remove, t_grown - t_add, len(rank0_pids), digest


def print_table(kinds: list[str], results: dict[str, list[tuple[float, float, int, str]]],
                nodes: int = 3) -> None:
    """The medians of each trainer side by side, with restart/live when both ran."""
    names = {"ray": "Ray", "restart": "restart", "live": "live"}
    both = "restart" in kinds and "live" in kinds
    rows = [(f"node removed -> first step at {nodes - 1} workers (s)", 0, ".1f"),
            (f"node added   -> first step at {nodes} workers (s)", 1, ".1f"),
            ("processes rank 0 ran in", 2, ".0f")]
    print("".ljust(46) + "".join(names[k].rjust(10) for k in kinds)
          + ("restart/live".rjust(14) if both else ""))
    for label, i, fmt in rows:
        med = {k: statistics.median(r[i] for r in results[k]) for k in kinds}
        line = f"  {label:<44}" + "".join(f"{med[k]:10{fmt}}" for k in kinds)
        if both and i < 2:
            line += f"{med['restart'] / med['live']:13.1f}x"
        print(line)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="planners only")
    parser.add_argument("--trials", type=int, default=1, help="resize trials per trainer")
    parser.add_argument("--nodes", type=int, default=3, choices=(2, 3),
                        help="simulated worker nodes, one worker each (default 3)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma list of GuardConfig(recovery=) modes RobustTrainer runs "
                             "under, side by side (restart, live; default both)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes {args.modes!r}: a comma list of {', '.join(MODES)}")
    bench_planners(reps=5 if args.quick else 21)
    if args.quick:
        return 0
    kinds = ["ray", *dict.fromkeys(modes)]
    results: dict[str, list[tuple[float, float, int, str]]] = {k: [] for k in kinds}
    for _ in range(args.trials):
        for kind in kinds:
            results[kind].append(resize_trial(kind, nodes=args.nodes))
            shrunk, grown, pids, digest = results[kind][-1]
            print(f"  trial {kind}: removal -> step on {args.nodes - 1}: {shrunk:.1f} s, addition "
                  f"-> step on {args.nodes}: "
                  f"{grown:.1f} s, rank 0 in {pids} process(es)"
                  + (f", final model {digest[:12]}" if digest else ""), flush=True)
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
           for k, v in results.items()}
    print(f"resize on a simulated {args.nodes}-node cluster (median of {args.trials}; shared, loaded machine):")
    for mode in kinds[1:]:
        print(f"  node removed -> first step at {args.nodes - 1} workers: Ray {med['ray'][0]:6.1f} s, rayguard "
              f"{mode} {med[mode][0]:6.1f} s  ({med['ray'][0] / med[mode][0]:.1f}x faster)")
        print(f"  node added   -> first step at {args.nodes} workers: Ray {med['ray'][1]:6.1f} s, rayguard "
              f"{mode} {med[mode][1]:6.1f} s  ({med['ray'][1] / med[mode][1]:.1f}x faster)")
    print_table(kinds, results, args.nodes)
    digests = {k: {r[3] for r in results[k]} for k in kinds[1:]}
    if "restart" in digests and "live" in digests:
        same = len(digests["restart"] | digests["live"]) == 1
        print(f"  final model, same resize schedule: live {'==' if same else '!='} restart "
              f"(bitwise; {sorted(d[:12] for d in digests['restart'] | digests['live'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
