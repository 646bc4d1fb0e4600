"""The event log of runs and sweeps: one record shape, one writer, one reader.

A run writes ``rayguard_events.jsonl`` in its run directory (``Result.path``); a sweep writes
``rayguard_sweep_events.jsonl`` in its experiment directory (:mod:`rayguard.tune.events`,
which adds ``trial_id``). One JSON object a line with at least ``time``, ``kind``, ``rank``,
``node``, ``step``, ``attempt`` and a human ``detail``; other fields sit beside them.
Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON,
readable by ``jq``). Reading (tolerant of unknown kinds and cut lines) is
:mod:`rayguard.observe.log`'s, for both files. Kinds: ``start``, ``attempt_started``,
``checkpoint_committed``, ``checkpoint_rejected``, ``stall_detected``, ``nan_detected``,
``worker_died``, ``restart``, ``restored``, ``failed``, ``finished`` (and ``preflight_error``,
``fault_injected``, ``crash_loop``, ``not_retried``, ``preemption_notice``,
``preemption_checkpoint``, and from :mod:`rayguard.observe` ``steps``
and ``straggler``). A person should be able to tell what happened from this file alone.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rayguard.constants import EVENTS_FILENAME

BASE_FIELDS = ("time", "kind", "rank", "node", "step", "attempt", "detail")
"""The fields every record has (``None`` where they do not apply, e.g. ``rank`` in a sweep)."""

KINDS = (
    "start", "attempt_started", "checkpoint_committed", "checkpoint_rejected",
    "stall_detected", "nan_detected", "worker_died", "restart", "restored", "failed",
    "finished", "preflight_error", "fault_injected", "crash_loop", "not_retried",
    "preemption_notice", "preemption_checkpoint",  # rayguard.train.preemption
    "steps", "straggler",  # rayguard.observe: per-rank step timing summaries, slow ranks
)


def make_event(kind: str, detail: str, *, rank: int | None = None, node: str | None = None,
               step: int | None = None, attempt: int | None = None, **extra: Any) -> dict[str, Any]:
    """Build one event record (``time`` is wall-clock seconds since the epoch)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}")
    event = {"time": time.time(), "kind": kind, "rank": rank, "node": node, "step": step,
             "attempt": attempt, "detail": detail}
    event.update(extra)
    return event


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as strings (``"nan"``), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def append_events(path: Path, events: Iterable[dict[str, Any]]) -> None:
    """Append ``events`` to the JSONL file ``path`` (created with its directory), one line
    each. Raises OSError; the caller decides whether a failed write matters."""
    text = "".join(json.dumps(json_safe(e), default=str, sort_keys=True) + "\n" for e in events)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


class EventLog:
    """Appends events to a JSONL file; safe to call from several threads of one process."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any]) -> None:
        with self._lock:
            try:
                append_events(self.path, [event])
            except OSError as exc:  # a full disk must not turn into a second failure
                logging.getLogger("rayguard").warning(
                    "rayguard: could not write event %s to %s: %s", event.get("kind"), self.path, exc)


def events_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / EVENTS_FILENAME


def read(path: str | os.PathLike[str], filesystem: Any = None) -> list[dict[str, Any]]:
    """The events of a run, oldest first. ``path``: the run directory or the JSONL file;
    ``filesystem``: the run's pyarrow filesystem when it is remote (``Result.filesystem``)."""
    if filesystem is not None and type(filesystem).__name__ != "LocalFileSystem":
        return _read_remote(str(path), filesystem)
    p = Path(path)
    if p.is_dir():
        p = events_path(p)
    if not p.exists():
        raise FileNotFoundError(
            f"no rayguard event log at {p}. Fix: pass the run directory (Result.path) of a "
            "run started with rayguard.RobustTrainer, or the path of its "
            f"{EVENTS_FILENAME}."
        )
    return _read(str(p), None)


def _read(path: str, filesystem: Any) -> list[dict[str, Any]]:
    """Streamed through the one reader (:mod:`rayguard.observe.log`): bounded memory per
    line, a crafted line is skipped."""
    from rayguard.observe.log import EventSource, read_log

    return read_log(EventSource("run", path, filesystem)).events


def _read_remote(path: str, filesystem: Any) -> list[dict[str, Any]]:
    if not path.endswith(".jsonl"):
        path = f"{path.rstrip('/')}/{EVENTS_FILENAME}"
    return _read(path, filesystem)


if __name__ == "__main__":  # python -m rayguard.events RUN_DIR [--follow] [--kind K] ...
    import sys

    from rayguard.observe.cli import events_main

    sys.exit(events_main())
