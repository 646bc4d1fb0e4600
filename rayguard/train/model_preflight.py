"""Collect a rank's :class:`~rayguard.doctor.model.ModelFacts` at its first report, and log
what the checks find (rank 0). Costs one walk of the modules and a sampled digest of the
replicated parameters, once per attempt; the facts ride on the report's first gather."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from rayguard.doctor.model import ModelFacts, check_model

logger = logging.getLogger("rayguard")

SAMPLE_ELEMENTS = 65536
"""Elements of each parameter that enter the fingerprint (strided over the whole tensor)."""


def _is_dtensor(t: Any) -> bool:
    return any(c.__name__ == "DTensor" for c in type(t).__mro__)


def _sample_bytes(t: Any) -> bytes:
    import torch

    flat = t.detach().reshape(-1)
    if flat.numel() > SAMPLE_ELEMENTS:
        flat = flat[:: flat.numel() // SAMPLE_ELEMENTS][:SAMPLE_ELEMENTS]
    return bytes(flat.contiguous().cpu().view(torch.uint8).numpy().tobytes())


def collect(state: Any, sharded: Any) -> ModelFacts:
    """This rank's facts; a failure to collect them never stops the report (no facts)."""
    try:
        return _collect(state, sharded)
    except Exception as exc:
        logger.debug("rayguard: model preflight skipped (%s)", exc)
        return ModelFacts()


def _collect(state: Any, sharded: Any) -> ModelFacts:
    import torch

    modules = [v for v in (sharded or {}).values() if isinstance(v, torch.nn.Module)] \
        if isinstance(sharded, dict) else []
    unsynced, sharded_model = [], False
    digest, replicated = hashlib.sha256(), 0
    for i, model in enumerate(modules):
        for name, mod in model.named_modules():
            if (isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)
                    and not isinstance(mod, torch.nn.SyncBatchNorm)):
                unsynced.append(f"{name or type(mod).__name__} ({type(mod).__name__})")
        for name, p in model.named_parameters():
            if _is_dtensor(p):
                sharded_model = True
                continue
            digest.update(f"{i}:{name}:{tuple(p.shape)}:{p.dtype}".encode())
            digest.update(_sample_bytes(p))
            replicated += 1
    signature, nbytes = _state_signature(state)
    return ModelFacts(tuple(unsynced), digest.hexdigest() if replicated else None, signature,
                      nbytes, sharded_model)


def _state_signature(state: Any) -> tuple[str | None, int]:
    import torch

    if state is None:
        return None, 0
    parts: list[str] = []
    nbytes = 0
    stack: list[tuple[str, Any]] = [("state", state)]
    while stack:
        where, obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            parts.append(f"{where}:{tuple(obj.shape)}:{obj.dtype}")
            nbytes += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend((f"{where}[{k!r}]", v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(obj))
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest(), nbytes


def log_findings(facts: list[ModelFacts]) -> list[str]:
    """Rank 0: warn about what the checks find; returns the messages (for tests)."""
    out = []
    for f in check_model(facts):
        out.append(f"rayguard preflight {f.code}: {f.message}. Fix: {f.fix}")
        logger.warning(out[-1])
    return out
