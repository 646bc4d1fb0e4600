from __future__ import annotations

import pytest

from rayguard.doctor.cuda import check_cuda, check_gpu_stack
from rayguard.doctor.probe import GpuInfo

from .helpers import UUID0, codes, gpu_probe


def cvd(value: str, **kw: object) -> list[str]:
    return codes(check_cuda(gpu_probe({"CUDA_VISIBLE_DEVICES": value}, **kw)))


@pytest.mark.parametrize("value", ["", "0", "1,0", "0,1", UUID0, UUID0[:12], "MIG-" + UUID0[4:],
                                   "MIG-GPU-1b2c3d4e-0000-1111-2222-333344445555/1/0"])
def test_valid_forms_are_clean(value):
    assert cvd(value) == []


def test_invalid_entry():
    assert cvd("0,gpu1") == ["CVD_INVALID_ENTRY"]
    assert cvd("0,-1") == ["CVD_INVALID_ENTRY"]


def test_duplicate():
    assert cvd("0,1,0") == ["CVD_DUPLICATE"]
    assert cvd(f"{UUID0},{UUID0.upper()}") == ["CVD_DUPLICATE"]


def test_index_beyond_gpus_present():
    assert cvd("0,2") == ["CVD_OUT_OF_RANGE"]
    assert cvd("0,2", gpus=None) == []  # GPU count unknown: no guess


def test_unknown_uuid():
    assert cvd("GPU-deadbeef") == ["CVD_UNKNOWN_UUID"]


def test_hides_all_and_no_gpus():
    assert cvd("-1") == ["CVD_HIDES_ALL"]
    assert cvd("0", gpus=[]) == ["CVD_NO_GPUS"]
    assert cvd("", gpus=[]) == []


def test_gpu_stack_clean_and_numa_unknown():
    assert check_gpu_stack(gpu_probe()) == []
    lost = [GpuInfo(0, uuid=UUID0, numa_node=-1), GpuInfo(1, numa_node=None)]
    assert codes(check_gpu_stack(gpu_probe(gpus=lost))) == ["GPU_NUMA_UNKNOWN"]
    assert check_gpu_stack(gpu_probe(gpus=lost, numa_nodes=1)) == []


def test_cpu_torch_on_gpu_node():
    versions = {"torch": "2.5.1+cpu", "python": "3.11.7"}
    assert codes(check_gpu_stack(gpu_probe(versions=versions))) == ["TORCH_CPU_BUILD_ON_GPU_NODE"]
    assert check_gpu_stack(gpu_probe(versions=versions, gpus=[])) == []


@pytest.mark.parametrize("cuda,driver,bad", [("12.4", "470.82.01", True), ("12.1", "525.60.13", False),
                                             ("11.8", "450.80.02", False), ("13.0", "570.1", True)])
def test_driver_vs_cuda(cuda, driver, bad):
    versions = {"torch": "2.5.1", "torch_cuda": cuda, "driver": driver, "nccl": "2.21.5"}
    assert ("CUDA_DRIVER_TOO_OLD" in codes(check_gpu_stack(gpu_probe(versions=versions)))) is bad


def test_nccl_missing_for_cuda_torch():
    versions = {"torch": "2.5.1", "torch_cuda": "12.4", "driver": "550.54.15"}
    assert codes(check_gpu_stack(gpu_probe(versions=versions))) == ["NCCL_NOT_FOUND"]
