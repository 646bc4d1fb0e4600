"""Crafted probes for the doctor's pure checks."""

from __future__ import annotations

from rayguard.doctor.probe import GpuInfo, NodeProbe

UUID0 = "GPU-1b2c3d4e-0000-1111-2222-333344445555"
UUID1 = "GPU-9f8e7d6c-0000-1111-2222-333344445555"

# What Ray Train's TorchTrainer sets in a worker (ray/train/torch/config.py), plus what Ray
# itself sets (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES) and Ray's NCCL error handling.
RAY_TRAIN_WORKER_ENV = {
    "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "41234", "ACCELERATE_TORCH_DEVICE": "cuda:1",
    "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0,1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def gpu_probe(env: dict[str, str] | None = None, **kw: object) -> NodeProbe:
    """A 2-GPU, 8-core node with eth0/ib0/lo and no InfiniBand HCA unless given."""
    defaults: dict[str, object] = dict(
        node="n1", hostname="n1", env=dict(env or {}), interfaces=["eth0", "ib0", "lo"],
        ib_devices=[], cpu_count=8, numa_nodes=2,
        gpus=[GpuInfo(0, uuid=UUID0, name="H100", pci_bus_id="0000:3b:00.0", numa_node=0),
              GpuInfo(1, uuid=UUID1, name="H100", pci_bus_id="0000:86:00.0", numa_node=1)],
        versions={"python": "3.11.7", "torch": "2.5.1", "torch_cuda": "12.4", "nccl": "2.21.5",
                  "driver": "550.54.15", "ray": "2.60.0", "rayguard": "0.1.0"},
    )
    defaults.update(kw)
    return NodeProbe(**defaults)  # type: ignore[arg-type]


def codes(findings: list) -> list[str]:
    return sorted(f.code for f in findings)
