"""Tensors from the driver to RobustTrainer workers and back, through rayguard's serializers.

RobustTrainer registers them in the driver (fit) and in every worker (set-up pipeline);
this checks both directions with dtypes Ray's default path mishandles.
"""

from __future__ import annotations

import pytest
import ray
import torch

import rayguard
from rayguard.serialization import register_tensor_serializers
from rayguard.testing.recorder import make_trainer

pytestmark = pytest.mark.slow

COLLECTOR = "rayguard-test-serialization-collector"


@ray.remote(num_cpus=0)
class Collector:
    def __init__(self) -> None:
        register_tensor_serializers()
        self.items: dict[int, tuple] = {}

    def put(self, rank: int, tensors: dict, worker_registered: bool) -> None:
        self.items[rank] = (tensors, worker_registered)

    def get(self) -> dict[int, tuple]:
        return self.items


def _loop(config: dict) -> None:
    import ray
    import torch

    import rayguard
    from rayguard.serialization import is_registered

    ctx = rayguard.train.get_context()
    big = ray.get(config["refs"][0])  # through the object store
    out = {
        "scaled": (big.float() * (ctx.rank + 2)).to(torch.bfloat16),
        "f8": config["f8"],  # came inside train_loop_config
        "param": torch.nn.Parameter(config["f8"].float()),
        "u16": (torch.arange(4) + ctx.rank).to(torch.uint16),
    }
    collector = ray.get_actor(config["collector"])
    ray.get(collector.put.remote(ctx.rank, out, is_registered()))
    rayguard.train.report({"done": 1.0})


def test_tensors_to_trainer_workers_and_back(ray_local, tmp_path) -> None:
    big = torch.randn(1024, 2048).to(torch.bfloat16)  # 4 MiB
    f8 = torch.randn(64).to(torch.float8_e4m3fn)
    collector = Collector.options(name=COLLECTOR).remote()
    try:
        trainer = make_trainer(_loop, tmp_path, config={"refs": [ray.put(big)], "f8": f8,
                                                        "collector": COLLECTOR},
                               guard=rayguard.GuardConfig(), name="serialization")
        trainer.fit()
        items = ray.get(collector.get.remote())
    finally:
        ray.kill(collector)
    assert sorted(items) == [0, 1]
    for rank, (out, worker_registered) in items.items():
        assert worker_registered
        assert torch.equal(out["scaled"], (big.float() * (rank + 2)).to(torch.bfloat16))
        assert out["f8"].dtype == torch.float8_e4m3fn
        assert torch.equal(out["f8"].view(torch.uint8), f8.view(torch.uint8))
        assert isinstance(out["param"], torch.nn.Parameter) and out["param"].requires_grad
        assert out["u16"].dtype == torch.uint16
        assert torch.equal(out["u16"].int(), torch.arange(4, dtype=torch.int32) + rank)
