"""Worker-side step timing: what each rank sends to the run's coordinator, at most every
``HealthConfig.step_summary_interval_s`` seconds, fire-and-forget.

A report costs two clock reads and a few additions here; nothing is sent per report. The
step time of a rank is the wall time between two consecutive reports (the first report of an
attempt starts the clock). A summary also carries a thinned sample of one metric (the loss)
so the report can draw it over steps without a line per step in the log, and the
``optimizer.step()`` calls made before its reports (``optimizer_steps``): a framework loop
that reports every N optimizer steps (Transformers, Lightning) says N, and its replay after a
restore is counted in optimizer steps (``replay_optimizer_steps``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

MAX_SAMPLES = 64
"""Metric samples per summary; more are thinned by doubling the stride."""


class StepTimer:
    """Accumulates one rank's step times and report latencies between summaries."""

    def __init__(self, *, interval_s: float, metric: str | None = "loss",
                 clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time, max_samples: int = MAX_SAMPLES) -> None:
        self.interval_s = interval_s
        self.metric = metric
        self._clock = clock
        self._wall = wall
        self._max_samples = max_samples
        self._last_report: float | None = None
        self._last_sent: float | None = None
        self._stride = 1
        self._begin_time: float | None = None
        self._replay_until: int | None = None
        self._stepped = 0  # optimizer steps since the last report
        self._reset()

    def end_attempt(self) -> dict[str, Any] | None:
        """The summary of the attempt that ends in this process (an in-place rollback): its
        steps are its own, and the next attempt's first report starts afresh."""
        summary = self.take()
        self._last_report = self._last_sent = None
        self._replay_until = None
        self._stepped = 0  # rolled back: never reported
        return summary

    def begin(self) -> None:
        """The loop got its state back (``load_state`` returned): its first step begins no
        earlier than now. Sent as ``begin_time`` with the summary of the first report, so
        that the goodput planner can count the first step as work (see
        :mod:`rayguard.observe.goodput`); ignored once a report was made."""
        if self._last_report is None:
            self._begin_time = self._wall()

    def replaying(self, until: int | None) -> None:
        """The loop restarts from a restore: its steps up to ``until`` (the highest step the
        run reached before) are replayed; their measured time is sent as ``replay_time_s``
        over ``replay_steps`` (each step's time after the attempt's first report), so that
        goodput counts what the replay took, not an average step; the optimizer steps made
        before those reports (the attempt's first one included) are sent as
        ``replay_optimizer_steps``."""
        self._replay_until = until

    def optimizer_stepped(self) -> None:
        """One ``optimizer.step()`` of this process (the optimizer hook that is also the
        watchdog's heartbeat): counted against the next report."""
        self._stepped += 1

    def _reset(self) -> None:
        self.replay_time_s = 0.0
        self.replay_steps = 0
        self.optimizer_steps = 0
        self.replay_optimizer_steps = 0
        self.reports = 0
        self.intervals = 0
        self.step_time_sum_s = 0.0
        self.step_time_max_s = 0.0
        self.blocked_sum_s = 0.0
        self.blocked_max_s = 0.0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.first_time: float | None = None
        self.begin_time: float | None = None
        self.last_time: float | None = None
        self.samples: list[list[float]] = []
        self._seen = 0

    def on_report(self, step: int, metrics: dict[str, Any], blocked_s: float) -> dict[str, Any] | None:
        """Account one report; returns a summary when one is due (the first report of the
        session, then every ``interval_s``), else None."""
        now = self._clock()
        if self._last_report is not None:
            dt = now - self._last_report - blocked_s  # this report's own blocking is not the step
            dt = max(dt, 0.0)
            if self._replay_until is not None and step <= self._replay_until:
                self.replay_time_s += dt
                self.replay_steps += 1
            self.intervals += 1
            self.step_time_sum_s += dt
            self.step_time_max_s = max(self.step_time_max_s, dt)
        self._last_report = now
        stepped, self._stepped = self._stepped, 0
        self.optimizer_steps += stepped
        if self._replay_until is not None and step <= self._replay_until:
            self.replay_optimizer_steps += stepped
        if self._replay_until is not None and step > self._replay_until:
            self._replay_until = None  # the replay is over
        self.reports += 1
        self.blocked_sum_s += blocked_s
        self.blocked_max_s = max(self.blocked_max_s, blocked_s)
        if self.first_step is None:
            self.first_step = step
            self.first_time = self._wall()
            self.begin_time, self._begin_time = self._begin_time, None
        self.last_step = step
        self.last_time = self._wall()  # the loop's last report: where a finished run's work ends
        self._sample(step, metrics)
        if self._last_sent is None or now - self._last_sent >= self.interval_s:
            self._last_sent = now
            return self.take()
        return None

    def _sample(self, step: int, metrics: dict[str, Any]) -> None:
        if self.metric is None:
            return
        value = metrics.get(self.metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        self._seen += 1
        if (self._seen - 1) % self._stride:
            return
        self.samples.append([step, float(value) if math.isfinite(value) else str(value)])  # type: ignore[list-item]
        if len(self.samples) >= 2 * self._max_samples:
            self.samples = self.samples[::2]
            self._stride *= 2

    def take(self) -> dict[str, Any] | None:
        """The summary since the last one (None when nothing was reported)."""
        if self.reports == 0:
            return None
        summary = {
            "reports": self.reports, "intervals": self.intervals,
            "step_time_sum_s": self.step_time_sum_s, "step_time_max_s": self.step_time_max_s,
            "blocked_sum_s": self.blocked_sum_s, "blocked_max_s": self.blocked_max_s,
            "first_step": self.first_step, "last_step": self.last_step,
            "first_time": self.first_time, "last_time": self.last_time,
            **({"begin_time": self.begin_time} if self.begin_time is not None else {}),
            **({"replay_time_s": self.replay_time_s, "replay_steps": self.replay_steps}
               if self.replay_steps else {}),
            **({"optimizer_steps": self.optimizer_steps} if self.optimizer_steps else {}),
            **({"replay_optimizer_steps": self.replay_optimizer_steps}
               if self.replay_optimizer_steps else {}),
            "metric": self.metric, "samples": self.samples,
        }
        self._reset()
        self._stride = 1
        return summary


_SUMMED = ("reports", "intervals", "step_time_sum_s", "blocked_sum_s", "replay_time_s",
           "replay_steps", "optimizer_steps", "replay_optimizer_steps")
_MAXED = ("step_time_max_s", "blocked_max_s")
_FIRST = ("first_step", "first_time", "begin_time")


def merge_summaries(earlier: dict[str, Any], later: dict[str, Any], *,
                    max_samples: int = MAX_SAMPLES) -> dict[str, Any]:
    """One rank's two consecutive summaries of one attempt as one: what :class:`StepTimer`
    sends over both intervals at once (counts and times summed, maxima kept, the first step
    and time of ``earlier``, everything else of ``later``; the samples joined and thinned
    as the timer thins them). A node's agent merges a rank's summaries of one batch, so that
    the coordinator reads one per rank per batch, whatever the ranks' interval."""
    out = {**earlier, **later}
    for key in _SUMMED:
        if key in earlier or key in later:
            out[key] = earlier.get(key, 0) + later.get(key, 0)
    for key in _MAXED:
        if key in earlier or key in later:
            out[key] = max(earlier.get(key, 0.0), later.get(key, 0.0))
    for key in _FIRST:
        if earlier.get(key) is not None:
            out[key] = earlier[key]
    samples = list(earlier.get("samples") or ()) + list(later.get("samples") or ())
    while len(samples) >= 2 * max_samples:
        samples = samples[::2]
    out["samples"] = samples
    return out

