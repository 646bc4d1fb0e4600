"""Health checks over one trial's series of results: pure functions, verdicts as data.

Every check takes plain numbers (a metric's recent values, result times) and the trial's
:class:`~rayguard.HealthConfig`, and returns a :class:`Verdict` when the trial is unhealthy,
``None`` when it is not. Nothing here touches Ray; :mod:`rayguard.tune.callback` feeds the
checks and :mod:`rayguard.tune.executor` acts on their decisions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rayguard.health.config import HealthConfig

NONFINITE = "nonfinite"
DIVERGENCE = "divergence"
STALL = "stall"
THROUGHPUT = "throughput_collapse"
MEMORY = "memory_growth"
CHECKS = (NONFINITE, DIVERGENCE, STALL, THROUGHPUT, MEMORY)

RECENT_INTERVALS = 3
"""Throughput collapse needs at least this many consecutive slow results (one slow step,
e.g. a checkpoint save, is not a collapse); ``window // 4`` when that is more."""

MIN_SLOW_INTERVAL_S = 0.5
"""A result that took less than this is never "slow": sub-second jitter of the driver's
result handling is not a throughput collapse."""


@dataclass(frozen=True)
class Verdict:
    """One check found a trial unhealthy."""

    trial_id: str
    check: str
    """One of :data:`CHECKS`."""
    metric: str | None
    """The metric judged (``None`` for stall and throughput)."""
    value: float
    """The observed value (the metric, seconds without a result, or results per second)."""
    threshold: float
    """The limit the value crossed."""
    since_iteration: int
    """First ``training_iteration`` judged bad: a restart uses a checkpoint from before it."""
    time: float
    """Wall-clock time (``time.time()``) of the verdict."""
    detail: str
    """A sentence a person can act on."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Point:
    """One result of a trial, reduced to what the checks read."""

    iteration: int
    time: float
    """Seconds (any monotonic clock) at which the result was received."""
    metrics: Mapping[str, float]
    """The numeric metrics the checks watch (watched and memory metrics)."""
    interval_s: float | None = None
    """Seconds the step took (Tune's ``time_this_iter_s``) when known."""


def is_nonfinite(value: object) -> bool:
    """True for NaN/inf floats (and numbers that convert to them)."""
    try:
        return not math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return False


def check_nonfinite(trial_id: str, point: Point, watch: Sequence[str], now: float
                    ) -> Verdict | None:
    """NaN or inf in a watched metric of this result."""
    for name in watch:
        if name in point.metrics and is_nonfinite(point.metrics[name]):
            value = float(point.metrics[name])
            return Verdict(trial_id, NONFINITE, name, value, math.inf, point.iteration, now,
                           f"{name}={value} at iteration {point.iteration}")
    return None


def check_divergence(trial_id: str, history: Sequence[Point], point: Point,
                     health: HealthConfig, now: float, best: float | None = None
                     ) -> Verdict | None:
    """The first watched metric is worse than ``divergence_factor`` x the trial's own best
    and x its rolling median (``history`` excludes ``point``; ``best``, when given, is the
    best value seen before ``history``'s window too). Defined for positive metrics
    (losses, accuracies); a best or median <= 0 skips the check."""
    factor = health.divergence_factor
    name = health.watch_metrics[0]
    if factor is None or name not in point.metrics:
        return None
    past = [p.metrics[name] for p in history if name in p.metrics
            and not is_nonfinite(p.metrics[name])]
    if len(past) < health.min_results or is_nonfinite(point.metrics[name]):
        return None
    value = float(point.metrics[name])
    median = statistics.median(past[-health.window:])
    pick = min if health.mode == "min" else max
    best = pick(past) if best is None else pick(best, pick(past))
    if best <= 0 or median <= 0:
        return None
    if health.mode == "min":
        threshold = factor * max(best, median)
        bad = value > threshold
    else:
        threshold = min(best, median) / factor
        bad = value < threshold
    if not bad:
        return None
    return Verdict(trial_id, DIVERGENCE, name, value, threshold, point.iteration, now,
                   f"{name}={value:.6g} at iteration {point.iteration} is beyond "
                   f"{factor}x the trial's best ({best:.6g}) and median ({median:.6g})")


def check_stall(trial_id: str, last_progress: float, now_monotonic: float, timeout_s: float,
                last_iteration: int, now: float) -> Verdict | None:
    """No result (or start) for longer than ``timeout_s`` seconds."""
    silent = now_monotonic - last_progress
    if silent <= timeout_s:
        return None
    return Verdict(trial_id, STALL, None, silent, timeout_s, last_iteration + 1, now,
                   f"no result for {silent:.1f} s (stall timeout {timeout_s:.1f} s) after "
                   f"iteration {last_iteration}")


def intervals(points: Sequence[Point]) -> list[float]:
    """Seconds each result took: its ``interval_s`` or the gap to the result before it."""
    out: list[float] = []
    for before, point in zip(points, points[1:], strict=False):
        gap = point.interval_s if point.interval_s is not None else point.time - before.time
        out.append(max(gap, 0.0))
    return out


def recent_count(health: HealthConfig) -> int:
    """How many consecutive slow results make a collapse."""
    return max(RECENT_INTERVALS, health.window // 4)


def check_throughput(trial_id: str, points: Sequence[Point], health: HealthConfig,
                     now: float) -> Verdict | None:
    """Results per second, over each of the last :func:`recent_count` results, below
    ``throughput_collapse_fraction`` x the trial's median rate over the window before them
    (and each of those results took at least :data:`MIN_SLOW_INTERVAL_S`)."""
    fraction = health.throughput_collapse_fraction
    recent_n = recent_count(health)
    if fraction is None or len(points) < health.min_results + recent_n:
        return None
    gaps = intervals(points[-(health.window + recent_n + 1):])
    recent, before = gaps[-recent_n:], gaps[:-recent_n]
    if len(before) < health.min_results - 1 or min(recent) < MIN_SLOW_INTERVAL_S:
        return None
    median_gap = statistics.median(before)
    if median_gap <= 0:
        return None
    median_rate, threshold = 1.0 / median_gap, fraction / median_gap
    rate = 1.0 / min(recent)  # the fastest of the recent results
    if rate >= threshold:
        return None
    since = points[-recent_n].iteration
    return Verdict(trial_id, THROUGHPUT, None, rate, threshold, since, now,
                   f"{rate:.3g} results/s or less over the last {recent_n} results, "
                   f"below {fraction} x the trial's median {median_rate:.3g}/s")


def check_memory(trial_id: str, points: Sequence[Point], health: HealthConfig,
                 now: float) -> Verdict | None:
    """A memory metric rose at every one of the last ``window`` results and by more than
    ``memory_growth_fraction`` in total."""
    fraction = health.memory_growth_fraction
    if fraction is None:
        return None
    for name in health.memory_metrics:
        series = [(p.iteration, float(p.metrics[name])) for p in points
                  if name in p.metrics and not is_nonfinite(p.metrics[name])]
        if len(series) < max(health.window, health.min_results):
            continue
        last = series[-health.window:]
        values = [v for _, v in last]
        rising = all(b > a for a, b in zip(values, values[1:], strict=False))
        if not rising or values[0] <= 0:
            continue
        growth = (values[-1] - values[0]) / values[0]
        if growth > fraction:
            return Verdict(trial_id, MEMORY, name, growth, fraction, last[0][0], now,
                           f"{name} rose at each of the last {len(values)} results, by "
                           f"{growth:.0%} (limit {fraction:.0%}) since iteration {last[0][0]}")
    return None


def check_result(trial_id: str, history: Sequence[Point], point: Point,
                 health: HealthConfig, now: float, best: float | None = None
                 ) -> Verdict | None:
    """All result checks in order of severity; the first unhealthy verdict, else ``None``.
    ``history`` holds the trial's earlier points (not ``point``), ``best`` the best value of
    the first watched metric seen before them (optional)."""
    verdict = check_nonfinite(trial_id, point, health.watch_metrics, now)
    if verdict is not None:
        return verdict
    series = [*history, point]
    return (check_divergence(trial_id, history, point, health, now, best)
            or check_throughput(trial_id, series, health, now)
            or check_memory(trial_id, series, health, now))


def numeric_metrics(result: Mapping[str, Any], names: Sequence[str]) -> dict[str, float]:
    """The named entries of a result that are numbers (NaN/inf kept), as floats."""
    out: dict[str, float] = {}
    for name in names:
        value = result.get(name)
        if isinstance(value, bool) or value is None:
            continue
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out
