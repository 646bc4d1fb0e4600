"""Coordinated, checksum-verified checkpoints: whole and verified, or invisible.

Standalone use::

    from rayguard import checkpoint
    checkpoint.save("ckpts/checkpoint_000010", {"model": model.state_dict(), "step": 10}, step=10)
    found = checkpoint.find_latest_valid("ckpts")   # (path, report) or None
    state = checkpoint.load(found[0])

The multi-rank protocol (``write_shard`` on every rank, ``commit`` on one) lives in
:mod:`rayguard.checkpoint.writer` and :mod:`rayguard.checkpoint.commit`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rayguard.checkpoint.commit import cleanup_staging, commit, discard_staging, staging_dir_for
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
    from rayguard.checkpoint.reader import read_shard, shard_rank_for
    from rayguard.checkpoint.rng import RNG_STATE_KEY, capture_rng_state, restore_rng_state
    from rayguard.checkpoint.writer import write_shard

# Names whose modules import torch (seconds): loaded on first use, so that reading and
# verifying checkpoints (the `rayguard checkpoint` CLI, every `rayguard` command) does not
# import torch.
_LAZY = {"load": "api", "save": "api", "read_shard": "reader", "shard_rank_for": "reader",
         "RNG_STATE_KEY": "rng", "capture_rng_state": "rng", "restore_rng_state": "rng",
         "write_shard": "writer"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rayguard.checkpoint' has no attribute {name!r}")
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
    "cleanup_staging",
    "commit",
    "discard_staging",
    "find_latest_valid",
    "load",
    "load_latest_valid",
    "normalize_state_dict_keys",
    "read_manifest",
    "read_shard",
    "restore_rng_state",
    "save",
    "scan",
    "shard_rank_for",
    "staging_dir_for",
    "verify",
    "write_shard",
]
