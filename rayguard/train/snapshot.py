"""Snapshot a checkpoint state into host memory the training loop no longer touches.

An asynchronous checkpoint (``CheckpointConfig(mode="async")``) blocks the loop only for
this copy; hashing and writing then read the snapshot in the background.

* CPU tensors are copied (``copy_``) into preallocated buffers;
* CUDA tensors are copied with ``non_blocking=True`` into pinned host buffers
  (``torch.empty(..., pin_memory=True)``); the copying streams are synchronised before the
  snapshot is returned;
* buffers are kept, keyed by the tensor's place in the state, and reused by the next
  snapshot when dtype and shape match: peak extra host memory is one snapshot;
* numpy arrays are copied, other leaves deep-copied; a tensor reached twice (tied weights)
  is snapshotted once, so the file holds one copy as in a synchronous save.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class SnapshotBuffers:
    """Host buffers reused across snapshots (one set per rank)."""

    def __init__(self, *, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory
        """Pinned buffers and non-blocking copies for CUDA tensors (else pageable, blocking)."""
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self.bytes_allocated = 0
        """Bytes of host buffers allocated so far (reuse allocates nothing)."""

    @property
    def nbytes(self) -> int:
        """Bytes the buffers hold now."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def take(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in this object's buffers; returns once every
        byte is in host memory (CUDA copies synchronised)."""
        devices: set[torch.device] = set()
        memo: dict[int, Any] = {}
        used: set[tuple[Any, ...]] = set()
        with torch.no_grad():
            out = self._copy(state, (), memo, devices, used)
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
        for key in set(self._buffers) - used:  # the state's structure changed: free the rest
            del self._buffers[key]
        return out

    def _copy(self, obj: Any, path: tuple[Any, ...], memo: dict[int, Any],
              devices: set[torch.device], used: set[tuple[Any, ...]]) -> Any:
        if id(obj) in memo:
            return memo[id(obj)]
        if isinstance(obj, torch.Tensor):
            out: Any = self._tensor(obj, path, devices, used)
        elif isinstance(obj, dict):
            out = type(obj)() if _plain_mapping(obj) else {}
            for key, value in obj.items():
                out[key] = self._copy(value, (*path, key), memo, devices, used)
        elif isinstance(obj, (list, tuple)):
            items = [self._copy(v, (*path, i), memo, devices, used) for i, v in enumerate(obj)]
            out = items if isinstance(obj, list) else _same_tuple(obj, items)
        elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return obj
        else:
            out = copy.deepcopy(obj)  # numpy arrays, scalars, dtypes, ...
        memo[id(obj)] = out
        return out

    def _tensor(self, t: torch.Tensor, path: tuple[Any, ...], devices: set[torch.device],
                used: set[tuple[Any, ...]]) -> torch.Tensor:
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            return t.detach().clone()  # refused by the encoder with a clear message
        cuda = t.device.type == "cuda" and self.pin_memory
        key = (path, t.dtype, tuple(t.shape), cuda)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=cuda)
            self._buffers[key] = buf
            self.bytes_allocated += buf.numel() * buf.element_size()
        used.add(key)
        buf.copy_(t.detach(), non_blocking=cuda)
        if cuda:
            devices.add(t.device)
        return buf.detach().requires_grad_(True) if t.requires_grad else buf


def _plain_mapping(obj: dict[Any, Any]) -> bool:
    """An OrderedDict or another dict subclass that builds empty with no arguments."""
    try:
        type(obj)()
    except TypeError:
        return False
    return True


def _same_tuple(obj: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    if type(obj) is tuple:
        return tuple(items)
    try:  # a namedtuple
        return type(obj)(*items)
    except TypeError:
        return tuple(items)
