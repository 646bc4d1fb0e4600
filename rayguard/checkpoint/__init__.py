"""Coordinated, checksum-verified checkpoints: whole and verified, or invisible.

Standalone use::

    from rayguard import checkpoint
    checkpoint.save("ckpts/checkpoint_000010", {"model": model.state_dict(), "step": 10}, step=10)
    found = checkpoint.find_latest_valid("ckpts")   # (path, report) or None
    state = checkpoint.load(found[0])

The multi-rank protocol (``write_shard`` on every rank, ``commit`` on one) lives in
:mod:`rayguard.checkpoint.writer` and :mod:`rayguard.checkpoint.commit`; it is internal (the
training loop reaches it through ``rayguard.train.report``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rayguard.checkpoint.fallback import (
    LoadResult,
    Rejection,
    ScanResult,
    find_latest_valid,
    load_latest_valid,
    scan,
)
from rayguard.checkpoint.keys import normalize_state_dict_keys
from rayguard.checkpoint.manifest import FileRecord, Manifest, ShardRecord, read_manifest
from rayguard.checkpoint.verify import Problem, VerifyReport, verify

if TYPE_CHECKING:
    from rayguard.checkpoint.api import load, save
    from rayguard.checkpoint.rng import RNG_STATE_KEY, capture_rng_state, restore_rng_state

# Names whose modules import torch (seconds): loaded on first use, so that reading and
# verifying checkpoints (the `rayguard checkpoint` CLI, every `rayguard` command) does not
# import torch.
_LAZY = {"load": "api", "save": "api", "RNG_STATE_KEY": "rng", "capture_rng_state": "rng",
         "restore_rng_state": "rng"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rayguard.checkpoint.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "RNG_STATE_KEY",
    "FileRecord",
    "LoadResult",
    "Manifest",
    "Problem",
    "Rejection",
    "ScanResult",
    "ShardRecord",
    "VerifyReport",
    "capture_rng_state",
    "find_latest_valid",
    "load",
    "load_latest_valid",
    "normalize_state_dict_keys",
    "read_manifest",
    "restore_rng_state",
    "save",
    "scan",
    "verify",
]
