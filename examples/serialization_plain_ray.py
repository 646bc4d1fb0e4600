"""rayguard's tensor serializers in a plain Ray program (no RobustTrainer).

Two lines turn them on: register in the driver, and name the same function as the
workers' setup hook so every worker process registers before it runs anything.

    python examples/serialization_plain_ray.py
"""

from __future__ import annotations

import json

import ray
import torch

from rayguard.serialization import is_registered, register_tensor_serializers


@ray.remote
def scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """Runs in a worker: returns a new float8 tensor (sent back through rayguard's path)."""
    return (t.float() * factor).to(torch.float8_e4m3fn)


@ray.remote
def worker_registered() -> bool:
    return is_registered()


@ray.remote
def scribble(t: torch.Tensor) -> None:
    t.zero_()  # a write by one receiver...


def main() -> dict:
    register_tensor_serializers()  # 1. the driver
    ray.init(
        address="local",  # start a fresh local cluster (use your cluster's address instead)
        num_cpus=2,
        object_store_memory=256 * 1024**2,
        include_dashboard=False,
        # 2. every worker process of this job, before its first task or actor
        runtime_env={"worker_process_setup_hook":
                     "rayguard.serialization.register_tensor_serializers"},
    )
    try:
        weights = torch.randn(2048, 2048, dtype=torch.bfloat16)  # 8 MiB
        ref = ray.put(weights)
        doubled = ray.get(scale.remote(ref, 2.0))
        ray.get(scribble.remote(ref))
        return {
            "worker_registered": ray.get(worker_registered.remote()),
            "float8_roundtrip": doubled.dtype == torch.float8_e4m3fn
            and torch.equal(doubled.float(), (weights.float() * 2).to(torch.float8_e4m3fn).float()),
            "bf16_bit_exact": torch.equal(ray.get(ref).view(torch.int16), weights.view(torch.int16)),
            "write_isolated": torch.equal(ray.get(ref), weights),  # ...is never seen by others
        }
    finally:
        ray.shutdown()


if __name__ == "__main__":
    print(json.dumps(main()))
