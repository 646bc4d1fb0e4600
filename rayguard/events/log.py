"""The one writer of event logs: append-only JSONL, for runs and sweeps.

A run's coordinator appends to ``rayguard_events.jsonl``; a sweep's in-memory log
(:class:`rayguard.tune.events.SweepLog`) appends to ``rayguard_sweep_events.jsonl``, both
through :class:`EventLog`, so both files have one record shape (:mod:`.record`) and one
encoding (strict JSON, sorted keys, non-finite floats as strings).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rayguard.events.record import json_safe


def append_events(path: Path, events: Iterable[dict[str, Any]]) -> None:
    """Append ``events`` to the JSONL file ``path`` (created with its directory), one line
    each. Raises OSError; the caller decides whether a failed write matters."""
    text = "".join(json.dumps(json_safe(e), default=str, sort_keys=True) + "\n" for e in events)
    # a link planted at the log's name (a shared run directory) is refused, never written
    # through; so is anything that is not a regular file
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:  # the directory is made on the first write only (a coordinator
        path.parent.mkdir(parents=True, exist_ok=True)  # appends hundreds a second at scale)
        fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file; not writing events into it")
        data = memoryview(text.encode("utf-8"))
        while data:  # straight to the descriptor: no buffered text file around one write
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


class EventLog:
    """Appends events to a JSONL file; safe to call from several threads of one process.

    A failed write (a full disk) never raises: the run must not fail a second time because
    its log could not be written. ``warn``: log that failure as a warning (a run's log) or
    not (a sweep's, whose events are also kept in memory)."""

    def __init__(self, path: str | os.PathLike[str], *, warn: bool = True) -> None:
        self.path = Path(path)
        self.warn = warn
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any]) -> None:
        self.extend([event])

    def extend(self, events: list[dict[str, Any]]) -> None:
        """Append ``events`` in one write (in order; none: the file is still created)."""
        with self._lock:
            try:
                append_events(self.path, events)
            except OSError as exc:
                if self.warn:
                    logging.getLogger("rayguard").warning(
                        "rayguard: could not write event %s to %s: %s",
                        ", ".join(str(e.get("kind")) for e in events[:3]), self.path, exc)
