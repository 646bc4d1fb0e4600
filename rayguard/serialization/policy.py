"""Where a received tensor lands and whether CPU tensors are shared zero-copy.

The policy is per process: the *receiving* process applies it when it rebuilds a tensor,
whatever the sender chose. ``register_tensor_serializers(cuda=..., zero_copy=...)`` sets it;
a process that never registers uses the defaults, or ``RAYGUARD_SERIALIZERS_CUDA`` when set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from rayguard.constants import SERIALIZERS_CUDA_ENV_VAR
from rayguard.exceptions import SerializationError, config_error, strict_fields

CudaPolicy = Literal["receiver", "cpu"]
CUDA_POLICIES: tuple[str, ...] = ("receiver", "cpu")

# Receiver-side CUDA placement for processes that never call register_tensor_serializers().
CUDA_POLICY_ENV_VAR = SERIALIZERS_CUDA_ENV_VAR

# Below this size a received CPU tensor is copied: a copy is cheaper than mapping pages.
DEFAULT_COW_MIN_BYTES = 4 * 1024**2


@strict_fields
@dataclass(frozen=True)
class SerializerPolicy:
    """How this process rebuilds tensors it receives."""

    cuda: str = "receiver"
    """``"receiver"``: a CUDA tensor lands on this process's current device
    (``torch.cuda.current_device()``), whatever ordinal the sender used; a process without
    CUDA raises :class:`SerializationError`. ``"cpu"``: CUDA tensors arrive as CPU tensors."""

    zero_copy: bool = True
    """Share large CPU tensors with the object store, copy-on-write (a write copies only the
    pages it touches, privately). ``False``: every received tensor is a private copy."""

    cow_min_bytes: int = DEFAULT_COW_MIN_BYTES
    """Tensors smaller than this are copied on receipt even when ``zero_copy`` is on."""

    def __post_init__(self) -> None:
        if self.cuda not in CUDA_POLICIES:
            raise config_error("SerializerPolicy", "cuda", self.cuda,
                               'must be "receiver" or "cpu"', 'pass cuda="receiver"')
        if not isinstance(self.zero_copy, bool):
            raise config_error("SerializerPolicy", "zero_copy", self.zero_copy,
                               "must be a bool", "pass zero_copy=True or False")
        if isinstance(self.cow_min_bytes, bool) or not (
            isinstance(self.cow_min_bytes, int) and self.cow_min_bytes >= 0
        ):
            raise config_error("SerializerPolicy", "cow_min_bytes", self.cow_min_bytes,
                               "must be an int >= 0", f"pass cow_min_bytes={DEFAULT_COW_MIN_BYTES}")


def default_policy() -> SerializerPolicy:
    """The policy of a process that has not registered: defaults, or the env variable."""
    return SerializerPolicy(cuda=os.environ.get(CUDA_POLICY_ENV_VAR, "receiver"))


# Per process, not per worker (rayguard.runtime): set with Ray's per-process registration, and
# read wherever Ray decodes, Ray's own threads too, which no worker binds.
_current: SerializerPolicy | None = None


def current_policy() -> SerializerPolicy:
    global _current
    if _current is None:
        _current = default_policy()
    return _current


def set_policy(policy: SerializerPolicy | None) -> None:
    """Install ``policy`` in this process (``None``: back to the default)."""
    global _current
    _current = policy


def plan_device(sent_device: str, policy: str, cuda_available: bool, current_device: int | None,
                what: str) -> str:
    """Pure: the device a received tensor is materialised on.

    ``sent_device`` is the sender's device string (``"cpu"``, ``"cuda:3"``); the sender's
    ordinal never matters. ``what`` names the tensor (dtype, shape) for the error message.
    """
    if not sent_device.startswith("cuda") or policy == "cpu":
        return "cpu"
    if not cuda_available or current_device is None:
        raise SerializationError(
            f"cannot rebuild {what} sent from device {sent_device}: this process has no CUDA "
            f"device (policy cuda='receiver'). Fix: request a GPU for this actor/task "
            f"(num_gpus=...), or receive on CPU with "
            f"register_tensor_serializers(cuda='cpu') or {CUDA_POLICY_ENV_VAR}=cpu"
        )
    return f"cuda:{current_device}"
