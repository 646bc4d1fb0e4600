"""The run's goodput while it runs, for the metrics (inside the run's coordinator actor).

Keeps what the goodput planner reads in bounded memory
(:class:`~rayguard.observe.compact_log.CompactLog`: a few events per attempt, however long
the run and however many ranks) and recomputes
:func:`rayguard.observe.goodput.goodput` when something changes the picture: a new attempt,
a restart, the end of the run, and at most every ``interval_s`` on step summaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rayguard.observe.compact_log import CompactLog
from rayguard.observe.goodput import goodput
from rayguard.observe.metrics import Update, goodput_updates

_NOW = ("attempt_started", "restart", "restored", "finished", "failed", "stall_detected",
        "preemption_notice")
"""Kinds after which the figures are recomputed at once."""

__all__ = ["CompactLog", "GoodputMeter"]


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
