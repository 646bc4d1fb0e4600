"""Which reported checkpoints ``ray.train.get_checkpoint()`` looks at, and how each is
verified (the facts :class:`rayguard.train.ray_report.RayReportBridge` chooses from)."""

from __future__ import annotations

import os
from typing import Any


def has_manifest(store: Any, path: str) -> bool:
    """Whether the checkpoint at ``path`` has a manifest entry (of any kind: a link or a
    FIFO there counts, and fails verification)."""
    from rayguard.checkpoint.manifest import MANIFEST_NAME

    if store.fs is None:
        return os.path.lexists(os.path.join(path, MANIFEST_NAME))
    from rayguard.checkpoint.remote import _join

    try:
        return bool(store.fs.get_file_info(_join(path, MANIFEST_NAME)).type.name != "NotFound")
    except OSError:
        return False


def candidates(store: Any, latest: str) -> list[str]:
    """Where ``get_checkpoint()`` looks, newest first: Ray's latest checkpoint, then the
    older reported checkpoints of the run directory (newer ones Ray never registered, a
    worker having died before every rank reported, are not offered)."""
    paths = store.candidates(set(), reported=True)
    real = [os.path.realpath(p) if store.fs is None else p for p in paths]
    mine = os.path.realpath(latest) if store.fs is None else latest
    older = paths[real.index(mine) + 1:] if mine in real else []
    return [latest, *older]


def verify_reported(store: Any, path: str) -> tuple[str, int | None, bool]:
    """``(problems, step, unverified)`` of a reported checkpoint: ``problems`` empty when it
    verifies; ``unverified`` when it has no manifest at all (reported before rayguard
    guarded the loop, or from a remote directory rayguard cannot seal)."""
    from pathlib import Path

    from rayguard.checkpoint.manifest import MANIFEST_NAME
    from rayguard.checkpoint.verify import verify
    from rayguard.exceptions import CheckpointCorruptError

    def check(local: str) -> tuple[str, int | None, bool]:
        if not os.path.lexists(Path(local) / MANIFEST_NAME):  # a link or FIFO is a manifest
            return "", None, True                              # that fails verification
        report = verify(local)
        problems = "; ".join(f"{p.file}: {p.what}" for p in report.problems)
        return problems, (report.manifest.step if report.manifest else None), False

    if store.fs is None:
        return check(path)

    try:
        if not has_manifest(store, path):
            return "", None, True
        with store.materialize(path) as local:
            return check(local)
    except (CheckpointCorruptError, OSError) as exc:
        return str(exc), None, False
