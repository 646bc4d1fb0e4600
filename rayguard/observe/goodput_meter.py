"""The run's goodput while it runs, for the metrics (inside the run's coordinator actor).

Keeps what the goodput planner reads in bounded memory (:class:`CompactLog`: a few events
per attempt and rank, however long the run) and recomputes
:func:`rayguard.observe.goodput.goodput` when something changes the picture: a new attempt,
a restart, the end of the run, and at most every ``interval_s`` on step summaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rayguard.observe.goodput import goodput
from rayguard.observe.metrics import Update, goodput_updates

_NOW = ("attempt_started", "restart", "restored", "finished", "failed", "stall_detected",
        "preemption_notice")
"""Kinds after which the figures are recomputed at once."""

_DROP = ("samples", "details", "stacks", "guard_config", "detail")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _merge_steps(into: dict[str, Any], e: dict[str, Any]) -> None:
    """One rank's step summaries of one attempt as one: the sums added, the spans widened."""
    for key in ("step_time_sum_s", "intervals", "reports", "replay_time_s", "replay_steps"):
        if isinstance(e.get(key), (int, float)):
            into[key] = into.get(key, 0) + e[key]
    first = _num(e.get("first_time")) or _num(e.get("time"))
    for key, value, pick in (("first_time", first, min), ("begin_time", e.get("begin_time"), min),
                             ("first_step", e.get("first_step"), min),
                             ("last_step", e.get("last_step"), max),
                             ("last_time", e.get("last_time"), max), ("time", e.get("time"), max)):
        if _num(value) is not None:
            into[key] = value if _num(into.get(key)) is None else pick(into[key], value)


def _merge_commit(into: dict[str, Any], e: dict[str, Any]) -> None:
    """One attempt's commits as one: their blocked seconds added (as the planner sums them)."""
    key = "blocked_s" if "blocked_s" in e or "blocked_s" in into else "seconds"
    if key == "blocked_s" and "seconds" in into and "blocked_s" not in into:
        into["blocked_s"] = into.pop("seconds")
    cost = max(_num(e.get("blocked_s", e.get("seconds"))) or 0.0, 0.0)
    into[key] = (_num(into.get(key)) or 0.0) + cost
    for field in ("step", "time"):
        value, old = _num(e.get(field)), _num(into.get(field))
        if value is not None and (old is None or old < value):
            into[field] = e[field]


class CompactLog:
    """What :func:`~rayguard.observe.goodput.goodput` reads of a log, in bounded memory: per
    attempt, the earliest event of each kind, one merged step summary per rank, one merged
    commit, the attempt's first event and the highest step it reached; and the run's last
    event. ``goodput(log.events())`` equals ``goodput`` of every event added."""

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._last: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self._kept) + (self._last is not None)

    def add(self, event: dict[str, Any]) -> None:
        t = _num(event.get("time"))
        if t is None:
            return
        e = {k: v for k, v in event.items() if k not in _DROP}
        kind, attempt = e.get("kind"), e.get("attempt")
        if self._last is None or t >= self._last["time"]:
            self._last = {"kind": kind if kind in ("finished", "failed") else "_last", "time": t}
        if kind == "steps":
            _merge_steps(self._kept.setdefault(("steps", attempt, e.get("rank")),
                                               {"kind": "steps", "attempt": attempt,
                                                "rank": e.get("rank")}), e)
        elif kind == "checkpoint_committed":
            _merge_commit(self._kept.setdefault(("commit", attempt), {
                "kind": kind, "attempt": attempt}), e)
        else:
            old = self._kept.get((kind, attempt))
            if old is None or t < old["time"]:
                self._kept[(kind, attempt)] = e
        self._mark(attempt, t, e)

    def _mark(self, attempt: Any, t: float, e: dict[str, Any]) -> None:
        """The attempt's first event (its start when it did not fail) and highest step."""
        if attempt is None:
            return
        first = self._kept.setdefault(("_first", attempt), {"kind": "_first",
                                                            "attempt": attempt, "time": t})
        first["time"] = min(first["time"], t)
        step = e.get("last_step", e.get("step"))
        if e.get("kind") not in ("restored", "start") and isinstance(step, int) \
                and not isinstance(step, bool):
            top = self._kept.setdefault(("_reached", attempt), {
                "kind": "_reached", "attempt": attempt, "step": step, "time": t})
            if step > top["step"]:
                top["step"] = step

    def events(self) -> list[dict[str, Any]]:
        return [*self._kept.values(), *([self._last] if self._last is not None else [])]


class GoodputMeter:
    def __init__(self, interval_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self.log = CompactLog()
        self._published: dict[str, float] = {}
        self._last = float("-inf")

    @property
    def _events(self) -> list[dict[str, Any]]:
        """The events kept (what the figure is computed from)."""
        return self.log.events()

    def on_event(self, event: dict[str, Any]) -> list[Update]:
        """Remember ``event``; the metric updates due now (often none)."""
        self.log.add(event)
        now = self._clock()
        if event.get("kind") not in _NOW and now - self._last < self.interval_s:
            return []
        self._last = now
        g = goodput(self.log.events())
        return goodput_updates(g.ratio, g.badput_s, self._published)
