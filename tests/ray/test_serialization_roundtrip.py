"""Tensors through a real local Ray cluster: ray.put/get, task args and returns, actors.

The driver registers rayguard's serializers; workers register through the
``worker_process_setup_hook``-free path: the actor/task calls register itself, so that
returns go through rayguard too (as RobustTrainer workers do).
"""

from __future__ import annotations

import dataclasses

import pytest
import ray
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayguard.serialization import (
    deregister_tensor_serializers,
    is_registered,
    register_tensor_serializers,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
          torch.uint16, torch.uint32, torch.uint64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]
PROPS = settings(max_examples=10, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def make(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = 1
    for s in shape:
        n *= s
    size = torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().reshape(-1)
    if t.numel() <= 1:
        t = t.as_strided((t.numel(),), (1,))
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@st.composite
def tensors(draw) -> torch.Tensor:
    """Any dtype; shapes with zeros; strided views with storage offsets, sometimes large."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=0, max_size=3)))
    if draw(st.integers(0, 9)) == 0:
        shape = (2, 1 << 19)  # 1-16 MiB: the object store's shared memory
    base = make(dtype, tuple(s + 1 for s in shape), draw(st.integers(0, 999)))
    view = base[tuple(slice(draw(st.integers(0, 1)), None) for _ in shape)]
    if view.dim() >= 2 and draw(st.booleans()):
        view = view.transpose(0, 1)
    return view


@ray.remote
def echo(x):
    register_tensor_serializers()
    return x


@ray.remote
class Holder:
    def __init__(self) -> None:
        register_tensor_serializers()
        self.value = None

    def set(self, x) -> bool:
        self.value = x
        return True

    def get(self):
        return self.value

    def describe(self, x) -> list:
        return [(str(t.dtype), tuple(t.shape), type(t).__name__, t.requires_grad) for t in x]


@pytest.fixture
def ray_registered(ray_local):
    register_tensor_serializers()
    yield ray_local


@pytest.fixture
def holder(ray_registered):
    h = Holder.remote()
    yield h
    ray.kill(h)


@PROPS
@given(x=tensors())
def test_put_get(ray_registered, x: torch.Tensor) -> None:
    assert same(ray.get(ray.put(x)), x)


@PROPS
@given(x=tensors())
def test_task_argument_and_return(ray_registered, x: torch.Tensor) -> None:
    assert same(ray.get(echo.remote(x)), x)


@PROPS
@given(x=tensors())
def test_actor_method_call(holder, x: torch.Tensor) -> None:
    assert ray.get(holder.set.remote(x))
    assert same(ray.get(holder.get.remote()), x)


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: dict


def test_nested_parameters_and_grad_flags_through_an_actor(holder) -> None:
    p = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.bfloat16))
    g = torch.randn(4, requires_grad=True)
    obj = {"state": [p, g], "batch": Batch(torch.arange(5).to(torch.uint16), {"f8": make(
        torch.float8_e4m3fn, (8,), 1)})}
    ray.get(holder.set.remote(obj))
    back = ray.get(holder.get.remote())
    assert isinstance(back["state"][0], torch.nn.Parameter) and back["state"][0].requires_grad
    assert same(back["state"][0], p) and back["state"][1].requires_grad and same(back["state"][1], g)
    assert isinstance(back["batch"], Batch) and same(back["batch"].x, obj["batch"].x)
    assert same(back["batch"].y["f8"], obj["batch"].y["f8"])
    assert ray.get(holder.describe.remote([p, g])) == [
        ("torch.bfloat16", (3, 3), "Parameter", True), ("torch.float32", (4,), "Tensor", True)]


def test_sparse_tensors(ray_registered) -> None:
    coo = torch.randn(6, 5).relu().to_sparse()
    csr = torch.randn(6, 5).relu().to(torch.bfloat16).to_sparse_csr()
    a, b = ray.get(echo.remote([coo, csr]))
    assert a.is_sparse and torch.equal(a.to_dense(), coo.to_dense())
    assert b.layout == torch.sparse_csr and torch.equal(b.to_dense(), csr.to_dense())


def test_register_is_idempotent_and_deregister_restores_ray_default(ray_local) -> None:
    register_tensor_serializers()
    register_tensor_serializers()
    assert is_registered()
    deregister_tensor_serializers()
    deregister_tensor_serializers()
    assert not is_registered()
    x = torch.arange(6, dtype=torch.float32)
    assert torch.equal(ray.get(ray.put(x)), x)  # Ray's own pickling again
    register_tensor_serializers()
    assert is_registered()


@ray.remote
class Relay:
    """Never calls register_tensor_serializers itself."""

    def __init__(self) -> None:
        self.value = None

    def keep(self, x) -> bool:
        from rayguard.serialization import is_registered

        self.value = x
        return is_registered()

    def give(self):
        return self.value


def test_a_process_that_receives_relays_through_rayguard(ray_registered) -> None:
    """Ray Train's controller forwards train_loop_config like this: torch's default pickling
    would fail to rebuild float8 in the next process."""
    relay = Relay.remote()
    try:
        f8 = make(torch.float8_e5m2, (16,), 3)
        assert ray.get(relay.keep.remote({"w": f8}))  # registered on receipt
        assert same(ray.get(relay.give.remote())["w"], f8)
    finally:
        ray.kill(relay)
