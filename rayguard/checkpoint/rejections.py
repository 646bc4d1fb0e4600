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

from filelock import FileLock

REJECTIONS_FILENAME = "rayguard_rejected.json"


def _file(root: str | os.PathLike[str]) -> Path:
    return Path(root) / REJECTIONS_FILENAME


def rejected(root: str | os.PathLike[str]) -> dict[str, str]:
    """Rejected checkpoint paths under ``root`` (absolute) and why."""
    path = _file(root)
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # an unreadable list rejects nothing; verification still guards every load
    return {str(Path(root) / name): why for name, why in names.items() if isinstance(why, str)}


def reject(checkpoint: str | os.PathLike[str], reason: str) -> None:
    """Record that ``checkpoint`` (a directory) must not be resumed from."""
    ckpt = Path(checkpoint)
    root = ckpt.parent
    path = _file(root)
    with FileLock(str(path) + ".lock", timeout=30):
        names: dict[str, str] = {}
        if path.exists():
            try:
                names = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                names = {}
        names[ckpt.name] = reason
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(names, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
