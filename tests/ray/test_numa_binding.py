"""NUMA binding inside real Ray actors: a simulated 2-socket node (RAYGUARD_TOPOLOGY) whose
two "sockets" are this machine's first two CPUs, read back with os.sched_getaffinity."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.exceptions import WorkerSetupError

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")


def simulated_2socket(tmp_path: Path, gpu_nodes: list[int]) -> str:
    """node 0 = CPUS[0], node 1 = CPUS[1]; GPU i sits on gpu_nodes[i]."""
    path = tmp_path / "topology_2socket.json"
    path.write_text(json.dumps({
        "hostname": "sim",
        "numa_nodes": [{"id": 0, "cpus": [CPUS[0]], "distances": [10, 21]},
                       {"id": 1, "cpus": [CPUS[1]], "distances": [21, 10]}],
        "gpus": [{"index": i, "numa_node": n} for i, n in enumerate(gpu_nodes)],
    }))
    return str(path)


def _binder():
    import ray

    @ray.remote(num_cpus=1)
    class Binder:
        def bind(self, mode: str, local_rank: int, peers: list[dict],
                 torch_first: bool) -> dict:
            if torch_first:  # as in a Ray Train worker, where torch is already loaded
                import torch  # noqa: F401
            from rayguard.placement.binding import setup_numa

            result = setup_numa(mode, local_rank, peers)
            import torch

            return {"result": result.to_dict(), "affinity": sorted(os.sched_getaffinity(0)),
                    "torch_threads": torch.get_num_threads(),
                    "omp": os.environ.get("OMP_NUM_THREADS"), "pid": os.getpid()}

    return Binder


def test_actors_get_their_gpus_node_and_thread_count(ray_local, tmp_path: Path) -> None:
    ray = ray_local
    # Interleaved: GPU 0 on node 1, GPU 1 on node 0, so rank 0 must land on the second CPU.
    env = {"env_vars": {TOPOLOGY_ENV_VAR: simulated_2socket(tmp_path, [1, 0])}}
    peers = [{"local_rank": 0, "gpu_ids": ["0"], "num_cpus": 1},
             {"local_rank": 1, "gpu_ids": ["1"], "num_cpus": 1}]
    binder = _binder()
    actors = [binder.options(runtime_env=env).remote() for _ in range(3)]
    try:
        out = ray.get([actors[0].bind.remote("auto", 0, peers, True),
                       actors[1].bind.remote("strict", 1, peers, False),
                       actors[2].bind.remote("off", 0, peers, False)])
    finally:
        for a in actors:
            ray.kill(a)
    r0, r1, off = out
    assert r0["affinity"] == r0["result"]["cpu_affinity"] == [CPUS[1]]
    assert r0["result"]["numa_node"] == 1 and r0["result"]["bound"]
    assert r1["affinity"] == r1["result"]["cpu_affinity"] == [CPUS[0]]
    assert r1["result"]["numa_node"] == 0
    for r in (r0, r1):  # torch loaded before (set_num_threads) or after (OMP_NUM_THREADS)
        assert r["torch_threads"] == r["result"]["threads"] == 1 and r["omp"] == "1"
    assert not off["result"]["bound"] and len(off["affinity"]) >= 2


def test_strict_failure_crosses_ray_as_worker_setup_error(ray_local, tmp_path: Path) -> None:
    ray = ray_local
    env = {"env_vars": {TOPOLOGY_ENV_VAR: simulated_2socket(tmp_path, [-1])}}
    actor = _binder().options(runtime_env=env).remote()
    peers = [{"local_rank": 0, "gpu_ids": ["0"], "num_cpus": 1}]
    try:
        with pytest.raises(WorkerSetupError, match="NUMA node of GPU"):
            ray.get(actor.bind.remote("strict", 0, peers, False))
        auto = ray.get(actor.bind.remote("auto", 0, peers, False))
    finally:
        ray.kill(actor)
    assert auto["result"]["bound"] and any("no NUMA node" in n for n in auto["result"]["notes"])


def test_topology_command_on_the_cluster(ray_local) -> None:
    import argparse

    from rayguard.placement.cli import run

    address = ray_local.get_runtime_context().gcs_address
    args = argparse.Namespace(json=True, workers=2, gpus_per_worker=0.0, cpus_per_worker=1.0,
                              address=address, connect_timeout=60.0, timeout=120.0)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run(args) == 0
    nodes = json.loads(buf.getvalue())
    assert len(nodes) == len([n for n in ray_local.nodes() if n["Alive"]]) >= 1
    plan = nodes[0]["plan"]
    assert [w["local_rank"] for w in plan["workers"]] == [0, 1]
    assert all(w["cpus"] for w in plan["workers"])
