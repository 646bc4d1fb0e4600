"""End to end through RobustTrainer: a simulated 2-socket node (RAYGUARD_TOPOLOGY) with two
logical GPUs; each worker must be bound to its GPU's NUMA node before the user's code runs,
and see it on its context."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rayguard.constants import TOPOLOGY_ENV_VAR

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")]


def _loop(config: dict) -> None:
    import ray
    import torch

    import rayguard

    ctx = rayguard.train.get_context()
    record = {"rank": ctx.rank, "local_rank": ctx.local_rank,
              "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "numa_node": ctx.numa_node,
              "ctx_affinity": list(ctx.cpu_affinity),
              "affinity": sorted(os.sched_getaffinity(0)),
              "torch_threads": torch.get_num_threads()}
    Path(config["out"], f"rank{ctx.rank}.json").write_text(json.dumps(record))
    rayguard.train.report({"done": 1})


@pytest.fixture
def two_logical_gpus(no_ray):
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False,
             object_store_memory=256 * 1024**2)
    yield ray
    ray.shutdown()


def test_workers_bound_to_their_gpus_node(two_logical_gpus, tmp_path: Path) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    import rayguard

    topo = tmp_path / "topology.json"
    # GPU 0 on node 1 (second CPU), GPU 1 on node 0 (first CPU): the plan must follow the GPU.
    topo.write_text(json.dumps({
        "numa_nodes": [{"id": 0, "cpus": [CPUS[0]]}, {"id": 1, "cpus": [CPUS[1]]}],
        "gpus": [{"index": 0, "numa_node": 1}, {"index": 1, "numa_node": 0}],
    }))
    env = {TOPOLOGY_ENV_VAR: str(topo)}
    out = tmp_path / "out"
    out.mkdir()
    trainer = rayguard.RobustTrainer(
        _loop, train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        torch_config=TorchConfig(backend="gloo"),  # torch here has no CUDA (logical GPUs)
        run_config=RunConfig(storage_path=str(tmp_path), name="numa",
                             worker_runtime_env={"env_vars": env}),
        guard_config=rayguard.GuardConfig(numa="auto"),
    )
    trainer.fit()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    cpu_of_node = {0: CPUS[0], 1: CPUS[1]}
    for r in ranks:
        (gpu,) = r["gpu_ids"]
        node = 1 if gpu == "0" else 0
        assert r["numa_node"] == node, r
        assert r["ctx_affinity"] == r["affinity"] == [cpu_of_node[node]], r
        assert r["torch_threads"] == 1, r
    assert sorted(r["gpu_ids"][0] for r in ranks) == ["0", "1"]
    # Ranks follow NUMA order, not GPU-id order: GPU 1 sits on NUMA node 0, so it is rank 0.
    assert [r["gpu_ids"] for r in ranks] == [["1"], ["0"]]
    assert [r["local_rank"] for r in ranks] == [0, 1]
