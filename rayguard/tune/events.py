"""The sweep's events: what the health callback saw and did, one record per happening.

An :class:`EventLog` lives in the driver, is shared by the callback (writer) and the
:class:`~rayguard.tune.handle.TuneRun` handle (reader, any thread), and appends each event
to ``<experiment dir>/rayguard_sweep_events.jsonl`` once the directory is known, in the
run log's record shape (:mod:`rayguard.events`: ``time``, ``kind``, ``rank``, ``node``,
``step``, ``attempt``, ``detail``, plus ``trial_id`` and the event's data fields) through
the run log's writer; :func:`read` uses the one reader of both logs
(:mod:`rayguard.observe.log`), which also reads files written with a nested ``data``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rayguard.events import BASE_FIELDS, append_events
from rayguard.observe.log import SWEEP_EVENTS_FILENAME, EventSource, read_log

EVENTS_FILE = SWEEP_EVENTS_FILENAME

# kinds
SWEEP_STARTED = "sweep_started"
TRIAL_STARTED = "trial_started"
UNHEALTHY = "unhealthy"
RESTART = "restart"
RESTORED = "restored"
FAILED = "failed"
SKIPPED = "skipped"
TRIAL_COMPLETED = "trial_completed"
TRIAL_ERRORED = "trial_errored"
STOP_REQUESTED = "stop_requested"
SWEEP_FINISHED = "sweep_finished"


@dataclass(frozen=True)
class SweepEvent:
    """One thing that happened in a sweep."""

    time: float
    """``time.time()`` when it happened."""
    kind: str
    """One of the kinds above (``unhealthy``, ``restart``, ``failed``, ...)."""
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
        """The event from a record read by :mod:`rayguard.observe.log` (either shape)."""
        data = {k: v for k, v in record.items() if k not in _RECORD_FIELDS}
        return cls(record["time"], record["kind"], record.get("trial_id"),
                   record.get("detail", ""), data)


_RECORD_FIELDS = frozenset((*BASE_FIELDS, "trial_id"))


class EventLog:
    """Thread-safe, append-only list of :class:`SweepEvent` with an optional JSONL file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[SweepEvent] = []
        self._path: Path | None = None

    def attach(self, directory: str | None) -> None:
        """Also write events (past and future) to ``directory``/:data:`EVENTS_FILE`."""
        if directory is None or "://" in directory:
            return
        with self._lock:
            if self._path is not None:
                return
            self._path = Path(directory) / EVENTS_FILE
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._write(self._events)

    @property
    def path(self) -> Path | None:
        """The JSONL file events are appended to; None before :meth:`attach`."""
        return self._path

    def record(self, kind: str, trial_id: str | None, detail: str,
               **data: Any) -> SweepEvent:
        event = SweepEvent(time.time(), kind, trial_id, detail, data)
        with self._lock:
            self._events.append(event)
            if self._path is not None:
                self._write([event])
        return event

    def extend(self, events: list[SweepEvent]) -> None:
        """Add events recorded earlier (a resumed sweep's history), keeping their times."""
        with self._lock:
            self._events.extend(events)
            if self._path is not None:
                self._write(events)

    def _write(self, events: list[SweepEvent]) -> None:
        if self._path is None:
            return
        try:
            append_events(self._path, [e.to_record() for e in events])
        except OSError:
            pass  # the log in memory stays complete; the file is a convenience

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
        self._path = state["path"]


def read(path: str | Path) -> list[SweepEvent]:
    """The events of a sweep from its experiment directory (or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / EVENTS_FILE
    parsed = read_log(EventSource("sweep", str(path)))
    return [SweepEvent.from_record(record) for record in parsed.events]
