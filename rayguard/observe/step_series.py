"""What the report draws of a run's step summaries, folded one summary at a time in bounded
memory (pure): per attempt the lead (lowest) rank's progress, for steps/s, and its samples
of the metric, both thinned (:mod:`~rayguard.observe.thinning`); per attempt the highest
step a summary showed; the mean step time over every summary; and the metric to draw (the
earliest summary's, unless one is asked for).

Summaries are :class:`rayguard.events.summary.StepSummary` or
:class:`rayguard.events.fast.StepLine` (the same attributes), in any order: curves are put
in time order at the end.
"""

from __future__ import annotations

from typing import Any

from rayguard.events.fields import number as _number
from rayguard.observe.thinning import MAX_POINTS, Thinned, thin

MAX_METRICS = 4
"""Metric names collected while the one to draw is not known yet (the earliest summary's:
one name in a real run; a crafted log cannot make the reader keep more)."""


def _time(chunk: tuple[float, Any]) -> float:
    return chunk[0]


class StepSeries:
    """The report's curves and step figures from step summaries; ``metric``: the one to draw
    (``None``: the earliest summary's)."""

    def __init__(self, metric: str | None = None) -> None:
        self.wanted = metric
        self.lead: dict[int, int] = {}
        """Per attempt, the lowest rank that sent a summary (its curves stand for the run)."""
        self.reached: dict[int, int] = {}
        """Per attempt, the highest ``last_step`` or ``step`` of its summaries."""
        self.step_means_s = 0.0  # the sum of each summary's mean step time
        self.step_means = 0  # ... over this many summaries
        self._first_metric: tuple[float, str] | None = None
        self._progress = Thinned(4 * MAX_POINTS, 16)  # (time, last_step) of the lead rank
        self._samples: dict[str, Thinned] = {}  # per metric: (time, samples) of the lead rank

    def add(self, s: Any) -> None:
        a, t = s.attempt, float(s.time) if s.time is not None else 0.0
        if a is not None:
            top, last, step = self.reached.get(a), s.last_step, s.step
            if last is not None and (top is None or last > top):
                top = last
            if step is not None and (top is None or step > top):
                top = step
            if top is not None:
                self.reached[a] = top
        intervals = s.intervals
        if intervals is not None and intervals > 0 and s.step_time_sum_s is not None:
            self.step_means_s += float(s.step_time_sum_s) / intervals
            self.step_means += 1
        metric = s.metric
        if metric and isinstance(metric, str) and (
                self._first_metric is None or t < self._first_metric[0]):
            self._first_metric = (t, metric)
        rank = s.rank
        if a is None or rank is None:
            return
        lead = self.lead.get(a)
        if lead is None or rank < lead:
            self.lead[a] = rank
            self._drop(a)
        elif rank != lead:
            return
        if s.last_step is not None:
            self._progress.add(a, (t, s.last_step))
        samples = s.samples
        if samples and isinstance(samples, list) and isinstance(metric, str):
            self._add_samples(metric, a, t, samples)

    def _add_samples(self, metric: str, a: int, t: float, samples: list[Any]) -> None:
        if self.wanted is not None and metric != self.wanted:
            return
        series = self._samples.get(metric)
        if series is None:
            if len(self._samples) >= MAX_METRICS:
                return
            series = self._samples[metric] = Thinned(4 * MAX_POINTS, 400)
        series.add(a, (t, samples), len(samples))

    def _drop(self, a: int) -> None:
        self._progress.drop(a)
        for series in self._samples.values():
            series.drop(a)

    def merge(self, later: StepSeries) -> None:
        """Add what ``later`` folded of the log's next part (read apart, in parallel)."""
        for a, top in later.reached.items():
            if a not in self.reached or top > self.reached[a]:
                self.reached[a] = top
        self.step_means_s += later.step_means_s
        self.step_means += later.step_means
        if later._first_metric is not None and (
                self._first_metric is None or later._first_metric[0] < self._first_metric[0]):
            self._first_metric = later._first_metric
        for a, rank in later.lead.items():
            lead = self.lead.get(a)
            if lead is not None and rank > lead:
                continue
            if lead is None or rank < lead:
                self.lead[a] = rank
                self._drop(a)
            self._progress.merge(a, later._progress)
            for name, theirs in later._samples.items():
                series = self._samples.get(name)
                if series is None:
                    if len(self._samples) >= MAX_METRICS:
                        continue
                    series = self._samples[name] = Thinned(4 * MAX_POINTS, 400)
                series.merge(a, theirs)

    # -- what the report draws --------------------------------------------------------------
    def metric_name(self) -> str:
        """The metric drawn: the one asked for, else the earliest summary's, else ``loss``."""
        if self.wanted:
            return self.wanted
        return self._first_metric[1] if self._first_metric is not None else "loss"

    def mean_step_s(self) -> float:
        """The mean of every summary's mean step time (0 without one)."""
        return self.step_means_s / self.step_means if self.step_means else 0.0

    def throughput(self, t0: float) -> list[dict[str, Any]]:
        """Steps/s of each attempt's lead rank between two of its (kept) summaries."""
        out = []
        for a in self._progress:
            prev: tuple[float, int] | None = None
            for t, last in sorted(self._progress.items(a), key=_time):
                if prev is not None and t > prev[0]:
                    out.append({"time": t - t0, "attempt": a,
                                "steps_per_s": max(last - prev[1], 0) / (t - prev[0])})
                prev = (t, last)
        out.sort(key=lambda p: p["time"])
        return thin(out)

    def metric(self, name: str) -> dict[str, Any]:
        """``{"name", "series"}``: per attempt, the lead rank's samples of ``name``, thinned
        to a share of :data:`MAX_POINTS` (at least 200 points each)."""
        series = self._samples.get(name)
        if series is None:
            return {"name": name, "series": []}
        offered = {a: series.offered(a) for a in series}
        total = sum(offered.values()) or 1
        out = []
        for a in sorted(series.keys()):  # type: ignore[type-var]
            pts = [p for _, chunk in sorted(series.items(a), key=_time) for p in chunk]
            kept = thin(pts, max(200, MAX_POINTS * offered[a] // total))
            out.append({"attempt": a, "points": [
                [p[0], _number(p[1])] for p in kept
                if isinstance(p, (list, tuple)) and len(p) == 2 and _number(p[0]) is not None]})
        return {"name": name, "series": out}
