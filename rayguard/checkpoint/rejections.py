"""Checkpoints a run must never resume from again, kept on disk beside them.

``<root>/rayguard_rejected.json`` maps a checkpoint directory name to why it was rejected:
failed verification (found by ``load_state``), or judged unhealthy by a Tune health check
(taken after an anomaly began). It survives worker-group restarts, new ``fit()`` calls and
Tune trial restarts, so a rejected checkpoint is never tried twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rayguard.checkpoint import safejson
from rayguard.checkpoint.fsio import atomic_write_bytes, locked
from rayguard.exceptions import CheckpointCorruptError

REJECTIONS_FILENAME = "rayguard_rejected.json"
MAX_REJECTIONS_BYTES = 16 * 1024 * 1024


def _file(root: str | os.PathLike[str]) -> Path:
    return Path(root) / REJECTIONS_FILENAME


def _read(path: Path) -> dict[str, str]:
    """The name -> reason entries of a rejection file; an unreadable or malformed file (any
    bytes: a list, a huge or deeply nested document) rejects nothing."""
    try:
        names = safejson.read_file(path, str(path), max_bytes=MAX_REJECTIONS_BYTES, max_depth=2)
    except (FileNotFoundError, CheckpointCorruptError):
        return {}  # verification still guards every load
    return {name: why for name, why in names.items() if isinstance(why, str)}


def rejected(root: str | os.PathLike[str]) -> dict[str, str]:
    """Rejected checkpoint paths under ``root`` (absolute) and why."""
    return {str(Path(root) / name): why for name, why in _read(_file(root)).items()}


def reject(checkpoint: str | os.PathLike[str], reason: str) -> None:
    """Record that ``checkpoint`` (a directory) must not be resumed from.

    The file is rewritten through a new randomly named temporary file and ``os.replace``,
    under a lock file opened ``O_NOFOLLOW``: a link planted in the run directory is never
    written through."""
    ckpt = Path(checkpoint)
    path = _file(ckpt.parent)
    with locked(str(path) + ".lock"):
        names = _read(path)
        names[ckpt.name] = reason
        atomic_write_bytes(path, json.dumps(names, indent=1, sort_keys=True).encode("utf-8"))
