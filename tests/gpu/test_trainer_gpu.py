"""On a real GPU: CUDA pinning from Ray's assigned ids, and DDP on NCCL with one worker.
Run on the GPU machine with tests/gpu/run_gpu_checks.sh; skipped without CUDA."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu


def _loop(config):
    import ray
    import torch
    import torch.distributed as dist

    import rayguard

    ctx = rayguard.train.get_context()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8).to(ctx.device))
    loss = model(torch.randn(4, 8, device=ctx.device)).sum()
    loss.backward()
    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t)
    with open(config["out"], "w") as f:
        json.dump({"device": str(ctx.device), "current": torch.cuda.current_device(),
                   "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                   "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "backend": dist.get_backend(), "sum": float(t)}, f)
    rayguard.train.report({"loss": float(loss)})


def test_pinning_and_nccl_ddp_on_one_gpu(tmp_path):
    import ray
    from ray.train import RunConfig, ScalingConfig

    import rayguard

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False)
    out = tmp_path / "gpu.json"
    rayguard.RobustTrainer(
        _loop, train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
        run_config=RunConfig(storage_path=str(tmp_path), name="gpu"),
    ).fit()
    seen = json.loads(out.read_text())
    print("GPU check:", seen)
    assert seen["device"] == f"cuda:{seen['current']}"
    assert seen["backend"] == "nccl" and seen["sum"] == 1.0
    visible = seen["visible"].split(",")
    assert visible.index(seen["gpu_ids"][0]) == seen["current"]
