"""Where the event logs live: a run's ``rayguard_events.jsonl`` in its run directory
(``Result.path``), a sweep's ``rayguard_sweep_events.jsonl`` in its experiment directory.

The names themselves are defined once, in :mod:`rayguard.constants` (which the driver and the
workers both read); paths are built only here.
"""

from __future__ import annotations

import os
from pathlib import Path

from rayguard.constants import EVENTS_FILENAME, SWEEP_EVENTS_FILENAME

LOG_FILENAMES = (("run", EVENTS_FILENAME), ("sweep", SWEEP_EVENTS_FILENAME))
"""``(log kind, file name)``, in the order a directory is searched for its log."""


def events_path(run_dir: str | os.PathLike[str]) -> Path:
    """The run log of ``run_dir``."""
    return Path(run_dir) / EVENTS_FILENAME


def sweep_events_path(experiment_dir: str | os.PathLike[str]) -> Path:
    """The sweep log of ``experiment_dir``."""
    return Path(experiment_dir) / SWEEP_EVENTS_FILENAME


def join(directory: str, name: str) -> str:
    """``directory/name`` for a local path or a path on a pyarrow filesystem."""
    return f"{directory.rstrip('/')}/{name}"


def log_kind(path: str) -> str:
    """``"sweep"`` for a sweep log's file, else ``"run"``."""
    return "sweep" if path.endswith(SWEEP_EVENTS_FILENAME) else "run"
