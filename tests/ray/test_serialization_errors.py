"""Deserialization failures reach the caller with dtype, shape and device, never a hang."""

from __future__ import annotations

import pytest
import ray
import torch

from rayguard.serialization import register_tensor_serializers
from rayguard.serialization.codec import TensorHeader, decode

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a receiver without CUDA")

DETAILS = r"torch\.bfloat16.*\[2, 3\].*cuda:1"


class SentFromGPU:
    """Pickles exactly as a CUDA bf16 tensor from device cuda:1 does (no GPU needed here)."""

    def __reduce__(self):
        header = TensorHeader("bfloat16", (2, 3), "cuda:1", False, False, None)
        return decode, (("raw", header, b"\0" * 12),)


@ray.remote
def receive(x) -> str:
    return str(x.device)


@ray.remote
def send() -> SentFromGPU:
    return SentFromGPU()


@ray.remote
class CpuReceiver:
    def __init__(self) -> None:
        register_tensor_serializers(cuda="cpu")

    def receive(self, x) -> tuple[str, str, tuple]:
        return str(x.device), str(x.dtype), tuple(x.shape)


def test_ray_get_raises_with_details(ray_local) -> None:
    register_tensor_serializers()
    ref = ray.put(SentFromGPU())
    with pytest.raises(Exception, match=DETAILS) as info:
        ray.get(ref, timeout=60)
    assert "cuda='cpu'" in str(info.value)


def test_task_argument_error_reaches_the_caller(ray_local) -> None:
    with pytest.raises(Exception, match=DETAILS):
        ray.get(receive.remote(SentFromGPU()), timeout=60)


def test_task_return_error_reaches_the_caller(ray_local) -> None:
    with pytest.raises(Exception, match=DETAILS):
        ray.get(send.remote(), timeout=60)


def test_cpu_policy_receives_on_cpu(ray_local) -> None:
    actor = CpuReceiver.remote()
    try:
        assert ray.get(actor.receive.remote(SentFromGPU()), timeout=60) == (
            "cpu", "torch.bfloat16", (2, 3))
    finally:
        ray.kill(actor)
