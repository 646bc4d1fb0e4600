"""The sweep's events: what the health callback saw and did, one record per happening.

A :class:`SweepLog` lives in the driver, is shared by the callback (writer) and the
:class:`~rayguard.tune.handle.TuneRun` handle (reader, any thread), keeps every event in
memory and, once the experiment directory is known, also appends each one to
``<experiment dir>/rayguard_sweep_events.jsonl`` through the one writer of event logs
(:class:`rayguard.events.EventLog`), in the run log's record shape (``time``, ``kind``,
``rank``, ``node``, ``step``, ``attempt``, ``detail``, plus ``trial_id`` and the event's data
fields). Kinds come from the one kind list (:mod:`rayguard.events.kinds`) and are checked
the same way as a run's. :func:`read` uses the one reader (:mod:`rayguard.events.read`),
which also reads files written with a nested ``data``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rayguard.constants import SWEEP_EVENTS_FILENAME
from rayguard.events.files import sweep_events_path
from rayguard.events.kinds import (
    FAILED,
    RESTART,
    RESTORED,
    SKIPPED,
    STOP_REQUESTED,
    SWEEP_FINISHED,
    SWEEP_STARTED,
    TRIAL_COMPLETED,
    TRIAL_ERRORED,
    TRIAL_STARTED,
    UNHEALTHY,
    check_kind,
)
from rayguard.events.lines import EventSource
from rayguard.events.log import EventLog as _Writer
from rayguard.events.read import read_log
from rayguard.events.record import BASE_FIELDS

EVENTS_FILE = SWEEP_EVENTS_FILENAME

__all__ = ["EVENTS_FILE", "FAILED", "RESTART", "RESTORED", "SKIPPED", "STOP_REQUESTED",
           "SWEEP_FINISHED", "SWEEP_STARTED", "TRIAL_COMPLETED", "TRIAL_ERRORED",
           "TRIAL_STARTED", "UNHEALTHY", "SweepEvent", "SweepLog", "read"]


@dataclass(frozen=True)
class SweepEvent:
    """One thing that happened in a sweep."""

    time: float
    """``time.time()`` when it happened."""
    kind: str
    """One of the sweep kinds (``unhealthy``, ``restart``, ``failed``, ...)."""
    trial_id: str | None
    detail: str
    """A sentence a person can read."""
    data: dict[str, Any] = field(default_factory=dict)
    """Machine-readable fields (the verdict, the checkpoint iteration, ...)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_record(self) -> dict[str, Any]:
        """The event in the shared record shape: the data fields beside the base fields
        (a data field named like a base field is kept under ``data_<name>``)."""
        record: dict[str, Any] = dict.fromkeys(BASE_FIELDS)
        record.update(time=self.time, kind=self.kind, detail=self.detail, trial_id=self.trial_id)
        for key, value in self.data.items():
            record[f"data_{key}" if key in record else key] = value
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SweepEvent:
        """The event from a record read by :mod:`rayguard.events.read` (either shape)."""
        data = {k: v for k, v in record.items() if k not in _RECORD_FIELDS}
        return cls(record["time"], record["kind"], record.get("trial_id"),
                   record.get("detail", ""), data)


_RECORD_FIELDS = frozenset((*BASE_FIELDS, "trial_id"))


class SweepLog:
    """Thread-safe, append-only list of :class:`SweepEvent` with an optional JSONL file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[SweepEvent] = []
        self._writer: _Writer | None = None

    def attach(self, directory: str | None) -> None:
        """Also write events (past and future) to ``directory``/:data:`EVENTS_FILE`."""
        if directory is None or "://" in directory:
            return
        with self._lock:
            if self._writer is not None:
                return
            # a failed write is not reported: the log in memory stays complete
            self._writer = _Writer(sweep_events_path(directory), warn=False)
            self._writer.path.parent.mkdir(parents=True, exist_ok=True)
            self._write(self._events)

    @property
    def path(self) -> Path | None:
        """The JSONL file events are appended to; None before :meth:`attach`."""
        return None if self._writer is None else self._writer.path

    def record(self, kind: str, trial_id: str | None, detail: str,
               **data: Any) -> SweepEvent:
        event = SweepEvent(time.time(), check_kind(kind), trial_id, detail, data)
        with self._lock:
            self._events.append(event)
            self._write([event])
        return event

    def extend(self, events: list[SweepEvent]) -> None:
        """Add events recorded earlier (a resumed sweep's history), keeping their times."""
        with self._lock:
            self._events.extend(events)
            self._write(events)

    def _write(self, events: list[SweepEvent]) -> None:
        if self._writer is not None:
            self._writer.extend([e.to_record() for e in events])

    def events(self, kind: str | None = None, trial_id: str | None = None
               ) -> list[SweepEvent]:
        with self._lock:
            out = list(self._events)
        return [e for e in out if (kind is None or e.kind == kind)
                and (trial_id is None or e.trial_id == trial_id)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def __getstate__(self) -> dict[str, Any]:  # pickled with the Tuner's run config
        return {"events": self.events(), "path": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._events = list(state["events"])
        path = state.get("path")
        self._writer = None if path is None else _Writer(path, warn=False)


def read(path: str | Path) -> list[SweepEvent]:
    """The events of a sweep from its experiment directory (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = sweep_events_path(path)
    parsed = read_log(EventSource("sweep", str(path)))
    return [SweepEvent.from_record(record) for record in parsed.events]

