"""A run's event log folded in one pass, in memory bounded by what its readers show rather
than by its length (pure, but for :func:`digest_log`): what ``rayguard report`` and
``rayguard events --goodput`` read.

Most of a long log is step summaries (``steps``: one per rank every few seconds). Of those,
a :class:`LogDigest` keeps no event, only what is drawn or computed from them:

- :attr:`LogDigest.compact`: what the goodput planner reads (the lead rank's summaries of
  each attempt merged into one, :class:`~rayguard.observe.compact_log.CompactLog`);
- :attr:`LogDigest.series`: the report's curves, thinned, and its step figures
  (:class:`~rayguard.observe.step_series.StepSeries`; ``curves=False``: not kept);
- in :meth:`LogDigest.events`, every other event as read, and between two of them, per
  attempt, the earliest and the latest summary that came (without their samples), so that
  the first and last events of each attempt and of the run, and the span between two
  ``start`` events, are those of the whole log.

Events may come in any order; :meth:`LogDigest.events` is in time order (ties: file order).
:func:`digest_log` reads a large local log in parts, one process per core (forked; the
parts' digests are merged in file order), as it reads a small or remote one in one.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Iterable
from typing import Any

from rayguard.events.fields import event_time
from rayguard.events.lines import EventSource, split_points
from rayguard.events.read import ParsedLog, iter_records
from rayguard.events.summary import StepSummary
from rayguard.observe.compact_log import CompactLog
from rayguard.observe.step_series import StepSeries

PARALLEL_MIN_BYTES = 32 << 20
"""A local log at least this large is read in parts, in parallel (32 MiB: about 40 000
events; below it a process costs more than it saves)."""
MAX_WORKERS = 4
"""Processes that read one log at most."""


def _time(event: dict[str, Any]) -> float:
    return event_time(event) or 0.0


class LogDigest:
    """One pass over a run's events (dicts, or typed step summaries from
    :func:`rayguard.events.read.iter_records`); ``metric``: the metric the report draws
    (``None``: the earliest summary's); ``curves=False``: only what goodput reads."""

    def __init__(self, metric: str | None = None, *, curves: bool = True) -> None:
        self.compact = CompactLog()
        self.series = StepSeries(metric) if curves else None
        self.bad_lines = 0
        self.summaries = 0
        """Step summaries read."""
        self._counts: dict[str, int] = {}
        self._kept: list[dict[str, Any]] = []
        self._open: dict[Any, list[Any]] = {}  # attempt -> [earliest, latest, t_min, t_max]
        self._sorted = True

    @classmethod
    def of(cls, events: Iterable[Any], metric: str | None = None) -> LogDigest:
        digest = cls(metric)
        for event in events:
            digest.add(event)
        return digest

    def add(self, record: Any) -> None:
        """One event: a dict, or a typed step summary."""
        if type(record) is not dict:
            self.add_steps(record)
            return
        kind = record.get("kind")
        if kind == "steps":
            self.add_steps(StepSummary(record))
            return
        key = str(kind)
        self._counts[key] = self._counts.get(key, 0) + 1
        if self._open:
            self._close_groups()
        self._kept.append(record)
        self._sorted = False
        self.compact.add(record)

    def add_steps(self, s: Any) -> None:
        """One step summary (the attributes of :class:`~rayguard.events.summary.StepSummary`)."""
        self.summaries += 1
        self.compact.add_steps(s)
        if self.series is not None:
            self.series.add(s)
        t = float(s.time) if s.time is not None else 0.0
        group = self._open.get(s.attempt)
        if group is None:
            self._open[s.attempt] = [s, s, t, t]
            return
        if t < group[2]:
            group[0], group[2] = s, t
        if t >= group[3]:
            group[1], group[3] = s, t

    def _close_groups(self) -> None:
        """The summaries since the last other event, per attempt: keep the earliest and the
        latest (what bounds the times of the log between two other events)."""
        for earliest, latest, _, _ in self._open.values():
            self._kept.append(earliest.event())
            if latest is not earliest:
                self._kept.append(latest.event())
        self._open.clear()
        self._sorted = False

    def merge(self, later: LogDigest) -> None:
        """Add ``later``, the digest of the log's next part."""
        self._close_groups()
        later._close_groups()
        for kind, n in later._counts.items():
            self._counts[kind] = self._counts.get(kind, 0) + n
        self.summaries += later.summaries
        self.bad_lines += later.bad_lines
        self._kept += later._kept
        self._sorted = False
        self.compact.merge(later.compact)
        if self.series is not None and later.series is not None:
            self.series.merge(later.series)

    def events(self) -> list[dict[str, Any]]:
        """Every event but the step summaries, with the summaries that bound each run of
        them (see the module's docstring), oldest first."""
        if self._open:
            self._close_groups()
        if not self._sorted:
            self._kept.sort(key=_time)
            self._sorted = True
        return self._kept

    def counts(self) -> dict[str, int]:
        """Events per kind, the step summaries included."""
        return {**self._counts, **({"steps": self.summaries} if self.summaries else {})}


def _digest_part(source: EventSource, start: int, end: int | None, metric: str | None,
                 fast: bool, curves: bool) -> LogDigest:
    digest, counts = LogDigest(metric, curves=curves), ParsedLog()
    add, add_steps = digest.add, digest.add_steps
    for record in iter_records(source, counts, fast=fast, start=start, end=end):
        if type(record) is dict:
            add(record)
        else:
            add_steps(record)
    digest.bad_lines = counts.bad_lines
    digest._close_groups()  # what crosses to the parent: dicts only
    return digest


def read_workers(requested: int | None = None) -> int:
    """Processes to read with: ``requested``, or by default the cores this process may use
    (at most :data:`MAX_WORKERS`); 1 where forking is not safe (not Linux, or threads
    running: a forked child can inherit a lock another thread held), whatever was asked."""
    if sys.platform != "linux" or threading.active_count() > 1:
        return 1
    if requested is not None:
        return max(1, int(requested))
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def digest_log(source: EventSource, metric: str | None = None, *, fast: bool = True,
               curves: bool = True, workers: int | None = None,
               parallel_min_bytes: int = PARALLEL_MIN_BYTES) -> LogDigest:
    """Read a run's log into a digest, streamed. A local log of at least
    ``parallel_min_bytes`` is read in ``workers`` parts (default: one per core; one part
    while other threads run, whatever was asked: :func:`read_workers`) by forked processes,
    each opening the file as the reader does; ``fast=False``: every line through the
    reference parser."""
    workers = read_workers(workers)
    parts: list[tuple[int, int | None]] = [(0, None)]
    if workers > 1 and source.filesystem is None and \
            os.path.getsize(source.path) >= parallel_min_bytes:
        parts = split_points(source, workers)
    jobs = [(source, start, end, metric, fast, curves) for start, end in parts]
    if len(jobs) == 1:
        return _digest_part(*jobs[0])
    with multiprocessing.get_context("fork").Pool(len(jobs) - 1) as pool:
        later = [pool.apply_async(_digest_part, job) for job in jobs[1:]]
        digest = _digest_part(*jobs[0])  # the first part here, the others meanwhile
        for result in later:
            digest.merge(result.get())
    return digest
