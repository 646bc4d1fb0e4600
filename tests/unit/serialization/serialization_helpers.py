"""Pickle through the codec the way Ray does (protocol 5, buffers out of band), without Ray."""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import torch

from rayguard.serialization.codec import decode, encode


def _reduce(t: torch.Tensor) -> tuple:
    return decode, (encode(t),)


def roundtrip(obj: Any, readonly: bool = True) -> Any:
    """dumps with out-of-band buffers, loads them back as (read-only) memoryviews."""
    buffers: list[pickle.PickleBuffer] = []
    f = io.BytesIO()
    p = pickle.Pickler(f, protocol=5, buffer_callback=buffers.append)
    p.dispatch_table = copyreg.dispatch_table.copy()
    p.dispatch_table[torch.Tensor] = _reduce
    p.dispatch_table[torch.nn.Parameter] = _reduce
    p.dump(obj)
    views = [bytes(b.raw()) for b in buffers]  # copy: the sender's memory stays the sender's
    mvs = [memoryview(v) if readonly else memoryview(bytearray(v)) for v in views]
    return pickle.loads(f.getvalue(), buffers=mvs)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t``'s values, for bit-exact comparison (NaNs included)."""
    t = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    if t.numel() <= 1:
        t = t.as_strided((t.numel(),), (1,))
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t
