"""Whether a checkpoint may be restored: the one switch between "any Tune checkpoint is
good" and rayguard's verified checkpoints (``rayguard.checkpoint.verify``)."""

from __future__ import annotations

import os
from pathlib import Path

MANIFEST_NAME = "rayguard_manifest.json"  # rayguard.checkpoint.manifest.MANIFEST_NAME


def _has_manifest(directory: Path) -> bool:
    return (directory / MANIFEST_NAME).is_file()


def checkpoint_is_good(path: str) -> bool:
    """True if the checkpoint at ``path`` may be restored.

    Remote paths (``scheme://``) are trusted. A local directory must exist; when it holds a
    rayguard manifest and ``rayguard.checkpoint.verify`` is available, its report must be ok.
    """
    if "://" in path:
        return True
    directory = Path(path)
    if not directory.is_dir():
        return False
    if not _has_manifest(directory):
        return True
    try:
        from rayguard.checkpoint import verify  # type: ignore[attr-defined]
    except ImportError:
        return True
    try:
        return bool(verify(os.fspath(directory)).ok)
    except Exception:
        return False
