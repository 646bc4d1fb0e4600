"""The one reader of event logs, local and remote: a run's ``rayguard_events.jsonl`` or a
sweep's ``rayguard_sweep_events.jsonl``, on a local path, a pyarrow filesystem
(``Result.filesystem``) or any URI it opens (``s3://...``, ``gs://...``, ``file://...``).

Unknown kinds, extra fields and lines that are not JSON (a line cut short by a crash) never
break a reader: unknown fields are kept, a bad line is skipped and counted. Any bytes give
events or skipped lines, never an exception (lines are read with :mod:`rayguard.safejson`:
bounded size, depth and numbers), and a log is streamed, never read whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayguard.constants import EVENTS_FILENAME, SWEEP_EVENTS_FILENAME
from rayguard.events.fast import MARKER as STEPS_MARKER
from rayguard.events.fast import decoder as fast_decoder
from rayguard.events.fields import number
from rayguard.events.files import LOG_FILENAMES, events_path, join, log_kind
from rayguard.events.lines import EventSource, LineReader
from rayguard.safejson import UnsafeJSONError, loads_line


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


def _is_remote(filesystem: Any) -> bool:
    return filesystem is not None and type(filesystem).__name__ != "LocalFileSystem"


def _exists(fs: Any, path: str) -> bool:
    if fs is None:
        return os.path.isfile(path)
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type == pafs.FileType.File


def locate(location: str, filesystem: Any = None) -> EventSource:
    """Find the event log of a run or sweep directory (or take the JSONL file itself)."""
    fs, path = (filesystem, location) if filesystem is not None else _split_uri(location)
    if path.endswith(".jsonl"):
        return EventSource(log_kind(path), path, fs)
    for kind, name in LOG_FILENAMES:
        candidate = join(path, name)
        if _exists(fs, candidate):
            return EventSource(kind, candidate, fs)
    raise FileNotFoundError(
        f"no rayguard event log in {location} (looked for {EVENTS_FILENAME} and "
        f"{SWEEP_EVENTS_FILENAME}). Fix: pass the run directory (Result.path) of a run started "
        "with rayguard.RobustTrainer, or the experiment directory of rayguard.tune.run. A remote "
        "run's log is uploaded every few seconds while it runs."
    )


def run_source(path: str | os.PathLike[str], filesystem: Any = None) -> EventSource:
    """The run log of ``path`` (the run directory or the JSONL file); ``filesystem``: the
    run's pyarrow filesystem when it is remote (``Result.filesystem``). A local log that is
    missing raises FileNotFoundError; a remote one is looked for when it is read."""
    if _is_remote(filesystem):
        location = str(path)
        if not location.endswith(".jsonl"):
            location = join(location, EVENTS_FILENAME)
        return EventSource("run", location, filesystem)
    p = Path(path)
    if p.is_dir():
        p = events_path(p)
    if not p.exists():
        raise FileNotFoundError(
            f"no rayguard event log at {p}. Fix: pass the run directory (Result.path) of a "
            "run started with rayguard.RobustTrainer, or the path of its "
            f"{EVENTS_FILENAME}."
        )
    return EventSource("run", str(p))


def read(path: str | os.PathLike[str], filesystem: Any = None) -> list[dict[str, Any]]:
    """The events of a run, oldest first. ``path``: the run directory or the JSONL file;
    ``filesystem``: the run's pyarrow filesystem when it is remote (``Result.filesystem``).
    Streamed: bounded memory per line, a crafted line is skipped."""
    return read_log(run_source(path, filesystem)).events


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


def parse_line(line: bytes | str, kind: str = "run") -> dict[str, Any] | None:
    """One event from one line, or None for a line that is not one (not JSON, too long, too
    deep, a number out of bounds, not an object, no string ``kind``, a ``time`` that is not
    a number)."""
    try:
        raw = loads_line(line)
    except UnsafeJSONError:
        return None
    if not isinstance(raw.get("kind"), str):
        return None
    stamp = raw.get("time")
    if stamp is not None and (isinstance(stamp, (bool, str)) or not isinstance(stamp, (int, float))):
        return None  # an event's time is a number ("nan" from a NaN literal is not one)
    return normalize(raw, kind)


def parse_lines(text: str, kind: str = "run") -> ParsedLog:
    out = ParsedLog()
    for line in text.splitlines():
        if line.strip():
            _add(out, parse_line(line, kind))
    return _sorted(out)


def _add(out: ParsedLog, event: dict[str, Any] | None) -> None:
    if event is None:
        out.bad_lines += 1
    else:
        out.events.append(event)


def _sorted(out: ParsedLog) -> ParsedLog:
    out.events.sort(key=lambda e: _num(e.get("time")))
    return out


def _num(value: Any) -> float:
    return number(value) or 0.0


def iter_events(source: EventSource, counts: ParsedLog | None = None) -> Iterator[dict[str, Any]]:
    """The events of a log in file order, streamed (memory bounded by one line); lines that
    are not events are counted in ``counts.bad_lines``."""
    out = counts if counts is not None else ParsedLog()
    reader = LineReader(source)
    for line in _with_tail(reader):
        if line is not None and not line.strip():
            continue
        event = None if line is None else parse_line(line, source.kind)
        if event is None:
            out.bad_lines += 1
        else:
            yield event


def iter_records(source: EventSource, counts: ParsedLog | None = None, *,
                 fast: bool = True, start: int = 0,
                 end: int | None = None) -> Iterator[dict[str, Any] | Any]:
    """As :func:`iter_events`, for readers of the whole log (the report, the goodput): a
    run log's step summaries that fit the fast path's schema come as typed records
    (:class:`rayguard.events.fast.StepLine`, with the attributes of
    :class:`rayguard.events.summary.StepSummary`), every other event as its dict. The same
    lines are events either way; ``fast=False``: dicts only. ``start``, ``end``: one part
    of a local log (:func:`rayguard.events.lines.split_points`)."""
    decode, errors = (fast_decoder() if fast and source.kind == "run" else None) or (None, ())
    out = counts if counts is not None else ParsedLog()
    for lines in _batches(LineReader(source, start=start, end=end)):
        for line in lines:
            if line is None:
                out.bad_lines += 1
                continue
            if decode is not None and STEPS_MARKER in line:
                try:
                    record = decode(line)
                except errors:  # not the schema's: the reference parser decides
                    pass
                else:
                    yield record
                    continue
            if not line.strip():
                continue
            event = parse_line(line, source.kind)
            if event is None:
                out.bad_lines += 1
            else:
                yield event


def _batches(reader: LineReader) -> Iterator[list[bytes | None]]:
    yield from reader.read_batches()
    tail = reader.finish()
    if tail is not None:
        yield [tail]


def _with_tail(reader: LineReader) -> Iterator[bytes | None]:
    yield from reader.read()
    tail = reader.finish()
    if tail is not None:
        yield tail


def read_log(source: EventSource) -> ParsedLog:
    """Every event of a log, sorted by time (the file is streamed, not read whole)."""
    out = ParsedLog()
    out.events.extend(iter_events(source, out))
    return _sorted(out)


def follow(source: EventSource, *, poll_s: float = 1.0, stop: Any = None) -> Iterator[dict[str, Any]]:
    """Yield every event, then new ones as they are appended (a live run), until ``stop()``
    returns True. Only whole lines are read; a line still being written waits for the next
    poll (a line longer than the bound is skipped, not buffered). Remote files are re-read
    from the last offset on each poll."""
    reader = LineReader(source)
    while True:
        try:
            for line in reader.read():
                event = None if line is None else parse_line(line, source.kind)
                if event is not None:
                    yield event
        except FileNotFoundError:
            pass
        if stop is not None and stop():
            return
        time.sleep(poll_s)
