"""CUDA tensors between actors that share one GPU (run on a GPU machine; skipped elsewhere).

The sender's tensor goes device -> pinned host -> object store; the receiver materialises
it on *its* current device, whatever ordinal the sender had.
"""

from __future__ import annotations

import pytest
import ray
import torch

from rayguard.serialization import register_tensor_serializers
from rayguard.serialization.codec import TensorHeader, decode

pytestmark = pytest.mark.gpu

BF16_256MIB = 128 * 1024 * 1024  # elements


def fingerprint(t: torch.Tensor) -> tuple[str, tuple[int, ...], int]:
    """dtype, shape and an exact checksum of the bits (computed where the tensor lives)."""
    bits = t.contiguous().view(-1).view(torch.int16).to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64) % 65521
    return str(t.dtype), tuple(t.shape), int((bits * weights).sum())


@ray.remote(num_gpus=0.5)
class GpuActor:
    def __init__(self, cuda: str = "receiver") -> None:
        register_tensor_serializers(cuda=cuda)

    def make(self, n: int) -> torch.Tensor:
        g = torch.Generator(device="cuda").manual_seed(0)
        return torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)

    def make_ref(self, n: int) -> tuple[list, tuple]:
        t = self.make(n)
        return [ray.put(t)], fingerprint(t)

    def check(self, t: torch.Tensor) -> tuple[str, int, tuple]:
        return str(t.device), torch.cuda.current_device(), fingerprint(t)

    def check_ref(self, refs: list) -> tuple[str, int, tuple]:
        return self.check(ray.get(refs[0], timeout=300))


class SentFromCuda3:
    def __init__(self, t: torch.Tensor) -> None:
        self.raw = t.view(torch.int16).numpy().tobytes()
        self.shape = tuple(t.shape)

    def __reduce__(self):
        header = TensorHeader("bfloat16", self.shape, "cuda:3", False, False, None)
        return decode, (("raw", header, self.raw),)


@pytest.fixture
def pair(ray_local):
    register_tensor_serializers()
    a, b = GpuActor.remote(), GpuActor.remote()
    yield a, b
    ray.kill(a)
    ray.kill(b)


def test_bf16_256mib_actor_to_actor_lands_on_the_receivers_device(pair) -> None:
    sender, receiver = pair
    refs, sent = ray.get(sender.make_ref.remote(BF16_256MIB), timeout=300)
    device, current, got = ray.get(receiver.check_ref.remote(refs), timeout=300)
    assert got == sent
    assert device == f"cuda:{current}"


def test_actor_result_passed_straight_to_another_actor(pair) -> None:
    sender, receiver = pair
    device, current, got = ray.get(receiver.check.remote(sender.make.remote(1 << 20)),
                                   timeout=300)
    assert device == f"cuda:{current}" and got[0] == "torch.bfloat16" and got[1] == (1 << 20,)


def test_senders_ordinal_is_ignored(pair) -> None:
    _, receiver = pair
    t = torch.randn(64, 8).to(torch.bfloat16)
    device, current, got = ray.get(receiver.check.remote(SentFromCuda3(t)), timeout=120)
    assert device == f"cuda:{current}"  # not cuda:3, which this machine may not even have
    assert got[2] == fingerprint(t)[2]


def test_cpu_policy_keeps_cuda_tensors_on_cpu(ray_local) -> None:
    register_tensor_serializers()
    sender = GpuActor.remote()
    receiver = GpuActor.remote(cuda="cpu")
    try:
        device, _, got = ray.get(receiver.check.remote(sender.make.remote(1 << 16)), timeout=300)
        assert device == "cpu" and got[0] == "torch.bfloat16"
    finally:
        ray.kill(sender)
        ray.kill(receiver)
