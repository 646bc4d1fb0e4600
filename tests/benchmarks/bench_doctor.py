"""How long `rayguard doctor` takes on a 4-node cluster simulated on this machine, against a
baseline of the same number of empty pinned tasks (the Ray cost the doctor cannot avoid),
and the per-worker preflight subset against reading os.environ.

    python tests/benchmarks/bench_doctor.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _empty(node_id: str) -> str:
    return node_id


def _pinned_empty_tasks() -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(_empty)
    refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(n["NodeID"]) for n in ray.nodes() if n["Alive"]]
    ray.get(refs)


def _timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 2 if args.quick else 5

    import ray
    from ray.cluster_utils import Cluster

    from rayguard.doctor import run, worker_preflight

    pre = _timed(lambda: worker_preflight(), 50)
    base = _timed(lambda: dict(os.environ), 50)
    print(f"worker_preflight: median {statistics.median(pre) * 1e3:.2f} ms "
          f"(dict(os.environ): {statistics.median(base) * 1e3:.3f} ms)")

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        # Cold: a fresh driver connection each time (the CLI's case: new workers per node).
        cold = _timed(lambda: run(cluster.address), reps)
        print(f"doctor, 4 nodes, own connection (CLI case): median {statistics.median(cold):.2f} s "
              f"(min {min(cold):.2f}, max {max(cold):.2f})")
        ray.init(address=cluster.address)
        first = _timed(lambda: run(), 1)[0]
        warm = _timed(lambda: run(), reps)
        empty = _timed(_pinned_empty_tasks, reps)
        print(f"doctor, 4 nodes, connected driver: first {first:.2f} s, then median "
              f"{statistics.median(warm):.3f} s; baseline 4 empty pinned tasks median "
              f"{statistics.median(empty):.3f} s; ratio {statistics.median(warm) / statistics.median(empty):.1f}x")
        ray.shutdown()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
