"""Turn a torch tensor into (header, raw bytes) and back, bit-exactly, for any dtype.

The sender ships the tensor's bytes as a ``pickle.PickleBuffer`` over a uint8 view, so
pickle protocol 5 hands them to Ray out of band and Ray writes them straight into the
object store (one copy, as for a numpy array). The receiver reinterprets the bytes with
``view(dtype)``, so bfloat16, every float8 and every unsigned width work; nothing goes
through numpy dtypes. No Ray import here: unit tests drive this with plain pickle.
"""

from __future__ import annotations

import pickle
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from rayguard.exceptions import SerializationError
from rayguard.serialization import cow, receipt
from rayguard.serialization.policy import SerializerPolicy, current_policy, plan_device

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TensorHeader:
    """Everything but the bytes. Plain values only: it is pickled in band."""

    dtype: str  # "bfloat16"
    shape: tuple[int, ...]
    device: str  # sender's device, e.g. "cuda:3"
    requires_grad: bool
    parameter: bool  # an nn.Parameter
    state: dict[str, Any] | None  # the tensor's __dict__ (Python attributes), if any
    version: int = FORMAT_VERSION

    def describe(self) -> str:
        return f"tensor(dtype=torch.{self.dtype}, shape={list(self.shape)}, device={self.device})"


def _needs_torch_path(t: torch.Tensor) -> bool:
    """Layouts and kinds the raw-bytes path does not cover: torch's own pickling handles them."""
    return (
        t.layout != torch.strided
        or t.is_quantized
        or t.is_nested
        or t.device.type not in ("cpu", "cuda")
        or any(n is not None for n in (getattr(t, "names", None) or ()))
    )


def _host_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D uint8 CPU tensor over ``t``'s values (no copy when already so)."""
    data = t.detach()
    if data.is_conj():
        data = data.resolve_conj()
    if data.is_neg():
        data = data.resolve_neg()
    data = data.contiguous().reshape(-1)
    if data.stride(0) != 1:  # one element: "contiguous" whatever its stride
        data = data.as_strided((data.numel(),), (1,))
    raw = data.view(torch.uint8) if data.dtype != torch.uint8 else data
    if raw.device.type == "cuda":
        staged = torch.empty(raw.shape, dtype=torch.uint8, pin_memory=True)
        staged.copy_(raw)  # device-to-host into pinned memory, full DMA bandwidth
        raw = staged
    return raw


def encode(t: torch.Tensor) -> tuple:
    """The payload ``decode`` rebuilds ``t`` from. Picklable; the bytes go out of band."""
    if _needs_torch_path(t):
        fn, args = t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[:2]
        return ("torch", fn, args)
    state = dict(t.__dict__) if t.__dict__ else None
    header = TensorHeader(
        dtype=str(t.dtype).removeprefix("torch."),
        shape=tuple(t.shape),
        device=str(t.device),
        requires_grad=bool(t.requires_grad),
        parameter=isinstance(t, torch.nn.Parameter),
        state=state,
    )
    if t.numel() == 0:
        return ("raw", header, b"")
    return ("raw", header, pickle.PickleBuffer(_host_bytes(t).numpy()))  # type: ignore[arg-type]


def decode(payload: tuple) -> torch.Tensor:
    """Rebuild a tensor from ``encode``'s payload, under this process's policy.

    Raises SerializationError naming dtype, shape and device on any failure.
    """
    _auto_register()
    if payload[0] == "torch":
        return payload[1](*payload[2])
    _, header, data = payload
    try:
        return _decode_raw(header, data, current_policy())
    except SerializationError:
        raise
    except Exception as e:
        raise SerializationError(
            f"cannot rebuild {header.describe()}: {type(e).__name__}: {e}"
        ) from e


_auto_registered = False  # per process: the registration it triggers is Ray's, per process


def _auto_register() -> None:
    global _auto_registered
    if not _auto_registered and "ray" in sys.modules:
        _auto_registered = True
        receipt.on_receipt()


def _dtype(header: TensorHeader) -> torch.dtype:
    dtype = getattr(torch, header.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise SerializationError(
            f"cannot rebuild {header.describe()}: this process's torch {torch.__version__} "
            f"has no dtype torch.{header.dtype}. Fix: use the same torch version everywhere"
        )
    return dtype


def _decode_raw(header: TensorHeader, data: Any, policy: SerializerPolicy) -> torch.Tensor:
    dtype = _dtype(header)
    cuda_ok = torch.cuda.is_available()
    target = plan_device(header.device, policy.cuda, cuda_ok,
                         torch.cuda.current_device() if cuda_ok else None, header.describe())
    fresh = isinstance(data, bytearray)  # in-band bytes: pickle made them for us alone
    buf = memoryview(data).cast("B")
    expected = _numel(header.shape) * torch.empty((), dtype=dtype).element_size()
    if buf.nbytes != expected:
        raise SerializationError(
            f"cannot rebuild {header.describe()}: got {buf.nbytes} bytes, expected {expected}"
        )
    if expected == 0:
        t = torch.empty(header.shape, dtype=dtype, device=target)
    elif target != "cpu":
        src = _frombuffer(buf).view(dtype).reshape(header.shape)  # read only; never written
        t = torch.empty(header.shape, dtype=dtype, device=target)
        t.copy_(src)
    else:
        t = _private_cpu_bytes(buf, fresh, policy).view(dtype).reshape(header.shape)
    return _finish(t, header)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _frombuffer(buf: memoryview) -> torch.Tensor:
    with warnings.catch_warnings():  # read-only buffers warn; callers never write to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=torch.uint8)


def _private_cpu_bytes(buf: memoryview, fresh: bool, policy: SerializerPolicy) -> torch.Tensor:
    """uint8 bytes that only this tensor owns: writes stay private (see cow.py)."""
    if fresh:
        return torch.frombuffer(buf, dtype=torch.uint8)
    if policy.zero_copy and buf.nbytes >= policy.cow_min_bytes:
        view = cow.private_view(buf)
        if view is not None:
            return torch.frombuffer(view, dtype=torch.uint8)
    return _frombuffer(buf).clone()


def _finish(t: torch.Tensor, header: TensorHeader) -> torch.Tensor:
    if header.parameter:
        t = torch.nn.Parameter(t, requires_grad=header.requires_grad)
    elif header.requires_grad:
        t.requires_grad_(True)
    if header.state:
        t.__dict__.update(header.state)
    return t
