"""Reading event logs, tolerantly: a run's ``rayguard_events.jsonl`` or a sweep's
``rayguard_sweep_events.jsonl``, on a local path or any pyarrow filesystem URI
(``s3://...``, ``gs://...``, ``file://...``).

Unknown kinds, extra fields and lines that are not JSON (a line cut short by a crash) never
break a reader: unknown fields are kept, a bad line is skipped and counted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rayguard.constants import EVENTS_FILENAME

SWEEP_EVENTS_FILENAME = "rayguard_sweep_events.jsonl"


@dataclass
class EventSource:
    """Where a log lives: ``kind`` is ``"run"`` or ``"sweep"``; ``path`` is the JSONL file
    on ``filesystem`` (``None``: the local filesystem)."""

    kind: str
    path: str
    filesystem: Any = None


@dataclass
class ParsedLog:
    events: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0


def _split_uri(location: str) -> tuple[Any, str]:
    if "://" not in location or location.startswith("file://"):
        return None, location.removeprefix("file://")
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path


def _exists(fs: Any, path: str) -> bool:
    if fs is None:
        return os.path.isfile(path)
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type == pafs.FileType.File


def locate(location: str, filesystem: Any = None) -> EventSource:
    """Find the event log of a run or sweep directory (or take the JSONL file itself)."""
    fs, path = (filesystem, location) if filesystem is not None else _split_uri(location)
    if path.endswith(".jsonl"):
        kind = "sweep" if path.endswith(SWEEP_EVENTS_FILENAME) else "run"
        return EventSource(kind, path, fs)
    for kind, name in (("run", EVENTS_FILENAME), ("sweep", SWEEP_EVENTS_FILENAME)):
        candidate = f"{path.rstrip('/')}/{name}"
        if _exists(fs, candidate):
            return EventSource(kind, candidate, fs)
    raise FileNotFoundError(
        f"no rayguard event log in {location} (looked for {EVENTS_FILENAME} and "
        f"{SWEEP_EVENTS_FILENAME}). Fix: pass the run directory (Result.path) of a run started "
        "with rayguard.RobustTrainer, or the experiment directory of rayguard.tune.run. A remote "
        "run's log is uploaded when fit() ends."
    )


def normalize(raw: dict[str, Any], kind: str) -> dict[str, Any]:
    """One shape for both logs. A sweep's records are written in the run's shape (with
    ``trial_id``); files from earlier versions nest a sweep event's fields under ``data``,
    which are lifted next to the run fields here."""
    if kind != "sweep":
        return raw
    event = dict(raw)
    data = event.pop("data", None)
    if isinstance(data, dict):
        for key, value in data.items():
            event.setdefault(key, value)
    event.setdefault("trial_id", None)
    return event


def parse_lines(text: str, kind: str = "run") -> ParsedLog:
    out = ParsedLog()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            out.bad_lines += 1
            continue
        if not isinstance(raw, dict) or "kind" not in raw:
            out.bad_lines += 1
            continue
        out.events.append(normalize(raw, kind))
    out.events.sort(key=lambda e: _num(e.get("time")))
    return out


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _read_bytes(source: EventSource, offset: int = 0) -> bytes:
    if source.filesystem is None:
        with open(source.path, "rb") as f:
            f.seek(offset)
            return f.read()
    with source.filesystem.open_input_file(source.path) as f:
        f.seek(offset)
        return f.read()


def read_log(source: EventSource) -> ParsedLog:
    return parse_lines(_read_bytes(source).decode("utf-8", errors="replace"), source.kind)


def follow(source: EventSource, *, poll_s: float = 1.0, stop: Any = None) -> Iterator[dict[str, Any]]:
    """Yield every event, then new ones as they are appended (a live run), until ``stop()``
    returns True. Only whole lines are read; a line still being written waits for the next
    poll. Remote files are re-read from the last whole line on each poll."""
    offset = 0
    pending = b""
    while True:
        try:
            chunk = _read_bytes(source, offset)
        except FileNotFoundError:
            chunk = b""
        offset += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if lines:
            parsed = parse_lines(b"\n".join(lines).decode("utf-8", errors="replace"), source.kind)
            yield from parsed.events
        if stop is not None and stop():
            return
        time.sleep(poll_s)
