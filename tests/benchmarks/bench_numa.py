"""NUMA placement benchmark (a program, not a test).

1. The planner on a simulated cluster: 512 nodes x 8 GPUs, 2 sockets x 48 cores x 2 threads
   each (target: plan_cluster < 50 ms).
2. A CPU-bound data-preparation loop run by one process per CPU at once, unbound (the
   scheduler places them) and bound by ``setup_numa`` to disjoint CPUs of this machine's
   real topology. On a single-socket machine nothing crosses a socket, so the expected
   difference is nil; any gain would come only from fewer migrations.

    python tests/benchmarks/bench_numa.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from rayguard.placement.binding import setup_numa
from rayguard.placement.numa import WorkerRequest, plan_cluster
from rayguard.placement.topology import Topology, discover_topology, topology_from_dict

TARGET_MS = 50.0


def big_node(name: str) -> Topology:
    cores, threads = 48, 2
    nodes = []
    for s in range(2):
        first = s * cores
        cpus = [c + t * 2 * cores for c in range(first, first + cores) for t in range(threads)]
        nodes.append({"id": s, "cpus": cpus, "distances": [10, 21] if s == 0 else [21, 10]})
    gpus = [{"index": i, "numa_node": i // 4, "uuid": f"GPU-{name}-{i}"} for i in range(8)]
    return topology_from_dict({"hostname": name, "numa_nodes": nodes, "gpus": gpus})


def bench_planner(reps: int) -> tuple[float, float]:
    """Median wall and median CPU (process) milliseconds of one plan_cluster call."""
    topo = big_node("n")  # identical nodes: one object, as the planner never mutates it
    cluster = {f"node-{i}": (topo, [WorkerRequest(r, (str(7 - r),), 8) for r in range(8)])
               for i in range(512)}
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        plans = plan_cluster(cluster)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    assert len(plans) == 512 and all(len(p.workers) == 8 for p in plans.values())
    return statistics.median(wall), statistics.median(cpu)


def _prep_loop(batches: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        x = rng.random((64, 3, 32, 32), dtype=np.float32)
        x = x[:, :, :, ::-1]  # flip
        x = (x - x.mean(axis=(0, 2, 3), keepdims=True)) / (x.std(axis=(0, 2, 3), keepdims=True) + 1e-6)
        np.sort(x.reshape(64, -1), axis=1)


def _worker(rank: int, n: int, bind: bool, batches: int, out: mp.Queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    if bind:
        peers = [{"local_rank": r, "gpu_ids": [], "num_cpus": 1} for r in range(n)]
        setup_numa("auto", rank, peers)
    t0 = time.perf_counter()
    _prep_loop(batches, rank)
    out.put(time.perf_counter() - t0)


def bench_prep(reps: int, batches: int) -> dict[str, float]:
    n = len(discover_topology().all_cpus())
    ctx = mp.get_context("fork")
    results: dict[str, list[float]] = {"unbound": [], "bound": []}
    for _ in range(reps):
        for mode in ("unbound", "bound"):
            q: mp.Queue = ctx.Queue()
            procs = [ctx.Process(target=_worker, args=(r, n, mode == "bound", batches, q))
                     for r in range(n)]
            t0 = time.perf_counter()
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            results[mode].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in results.items()} | {"procs": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    reps = 3 if args.quick else 9
    wall, cpu = bench_planner(reps)
    print(f"planner: 512 nodes x 8 GPUs (4096 workers, 192 CPUs/node): median wall {wall:.1f} ms, "
          f"median CPU time {cpu:.1f} ms; target {TARGET_MS:.0f} ms (wall/target = "
          f"{wall / TARGET_MS:.2f}, cpu/target = {cpu / TARGET_MS:.2f}; on a loaded machine "
          "wall time includes waiting for a core)")
    prep = bench_prep(3 if args.quick else 7, 150 if args.quick else 400)
    topo = discover_topology()
    print(f"data prep: {int(prep['procs'])} processes at once on {len(topo.numa_nodes)} NUMA "
          f"node(s): unbound median {prep['unbound']:.2f} s, bound median {prep['bound']:.2f} s, "
          f"bound/unbound = {prep['bound'] / prep['unbound']:.3f}")
    if len(topo.numa_nodes) == 1:
        print("note: single NUMA node here: nothing crosses a socket, so the expected "
              "difference is nil; what remains is noise and scheduler migrations.")


if __name__ == "__main__":
    main()
