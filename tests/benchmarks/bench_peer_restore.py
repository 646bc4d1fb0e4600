"""A lost node's ranks restore from peer memory vs from disk (simulated 3-node cluster).

Two ranks, one per node of one CPU, a third node spare; each rank saves its own
``--mib-per-rank`` MiB state at every step. After step ``HOLD`` commits (and, with the memory
tier, both copies of both shards are registered), rank 1's node is removed; the whole group
restarts on the two nodes left. Per mode (``CheckpointConfig(memory_tier=False)`` = disk,
``True`` = peer memory, ``memory_tier=True, memory_peer_copy=False`` = own: the lost node's
rank reads the disk), measured in the run:

- load: seconds inside ``rayguard.train.load_state()`` after the restart, rank 1 (whose own
  memory copy went with its node) and the slowest rank;
- restart: seconds from the node's removal to the first step done after the restart;
- save: median seconds a ``report(state=)`` blocked the loop in attempt 0 (the peer copy is
  taken in the background, so it should not show here).

The disk files were just written, so the disk path reads them from the page cache: the
favourable case for disk.

    .venv/bin/python tests/benchmarks/bench_peer_restore.py [--mib-per-rank 64] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

STEPS, HOLD = 5, 2


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
        t0 = time.perf_counter()
        rayguard.train.report({"step": step}, state=state)
        _mark(out, {"what": "save", "rank": ctx.rank, "s": time.perf_counter() - t0,
                    "attempt": ctx.attempt, "step": step})
        if ctx.attempt > 0 and step == start and ctx.rank == 0:
            _mark(out, {"what": "first_step", "time": time.time()})
        if step == HOLD and ctx.attempt == 0:
            _mark(out, {"what": "held", "rank": ctx.rank, "node": ctx.node_id})
            while True:  # until the bench removes rank 1's node and Ray restarts the group
                rayguard.train.heartbeat()
                time.sleep(0.2)


def _mark(out: str, row: dict) -> None:
    with open(os.path.join(out, "marks.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def _marks(out: str) -> list[dict]:
    path = os.path.join(out, "marks.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_once(mode: str, mib: int, root: str) -> dict:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    import rayguard
    from rayguard.events import read as read_events
    from rayguard.testing.cluster import SimulatedCluster, wait_for
    from rayguard.testing.coordinator import memory_copies

    memory = mode != "disk"
    name = f"{mode}-{time.time_ns()}"
    out = os.path.join(root, name + "-marks")
    os.makedirs(out)
    with SimulatedCluster(worker_nodes=3, object_store_bytes=max(512, 6 * mib) * 1024**2) as sim:
        trainer = rayguard.RobustTrainer(
            loop, train_loop_config={"out": out, "mib": mib},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=root, name=name, failure_config=FailureConfig(
                max_failures=2, controller_failure_limit=0)),
            guard_config=rayguard.GuardConfig(
                numa="off", preflight=False, progress_interval_s=None,
                checkpoint=rayguard.CheckpointConfig(memory_tier=memory,
                                                     memory_peer_copy=mode == "peer")))
        thread = sim.fit_in_background(trainer)
        held = wait_for(lambda: (lambda h: h if len(h) == 2 else None)(
            {m["rank"]: m["node"] for m in _marks(out) if m["what"] == "held"}),
            timeout_s=600, what="both ranks held")
        if mode == "peer":
            coordinator = trainer._coordinator
            wait_for(lambda: len([c for c in memory_copies(coordinator) if c[3] is not None
                                  and c[0] == ray.get(coordinator.memory_committed.remote())])
                     == 2 or None, timeout_s=300, what="both peer copies")
        removed = time.time()
        sim.remove_worker_node([n.node_id for n in sim.nodes].index(held[1]))
        result = sim.join(thread, timeout_s=600)
    marks = _marks(out)
    restored = [e for e in read_events(result.path) if e["kind"] == "restored"]
    loads = {m["rank"]: m["s"] for m in marks if m["what"] == "load"}
    first = next(m["time"] for m in marks if m["what"] == "first_step")
    saves = [m["s"] for m in marks if m["what"] == "save" and m["attempt"] == 0 and m["step"] >= 1]
    return {"load1_s": loads[1], "load_s": max(loads.values()), "restart_s": first - removed,
            "save_s": statistics.median(saves),
            "served": {k: restored[0].get(k) for k in ("tier", "copy", "copies")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib-per-rank", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    keys = (("load1_s", "load_state() after restart, rank 1 (node lost)"),
            ("load_s", "load_state() after restart (slowest rank)"),
            ("restart_s", "node removed -> first step after restart"),
            ("save_s", "report(state=) blocked per checkpoint"))
    rows: dict[str, list[dict]] = {"disk": [], "own": [], "peer": []}
    with tempfile.TemporaryDirectory(prefix="rg-bench-peer-") as root:
        for _ in range(args.repeats):
            for mode in rows:
                row = run_once(mode, args.mib_per_rank, root)
                rows[mode].append(row)
                print(f"{mode:5s} " + "  ".join(f"{k} {row[k]:.3f} s" for k, _ in keys)
                      + f"  restored: {row['served']}", flush=True)
    print(f"\nstate: 2 ranks x {args.mib_per_rank} MiB; medians of {args.repeats} run(s) per mode")
    for key, what in keys:
        d, o, p = (statistics.median(r[key] for r in rows[m]) for m in rows)
        print(f"{what:50s} disk {d:7.3f} s  own memory {o:7.3f} s  peer memory {p:7.3f} s  "
              f"peer/disk {p / d:.2f}x")


if __name__ == "__main__":
    main()
