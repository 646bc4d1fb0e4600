"""Health checks over a series of observations (a trial's results): divergence, throughput
collapse, memory growth. Pure functions; each judges the series against its own history
with the rules of a :class:`~rayguard.tune.SweepHealthConfig` and returns a
:class:`~rayguard.health.checks.Verdict` or ``None``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rayguard.health.checks import (
    DIVERGENCE,
    MEMORY,
    THROUGHPUT,
    Point,
    Verdict,
    check_nonfinite,
    is_nonfinite,
)
from rayguard.health.sweep_config import SweepHealthConfig

RECENT_INTERVALS = 3
"""Throughput collapse needs at least this many consecutive slow results (one slow step,
e.g. a checkpoint save, is not a collapse); ``window // 4`` when that is more."""

MIN_SLOW_INTERVAL_S = 0.5
"""A result that took less than this is never "slow": sub-second jitter of the driver's
result handling is not a throughput collapse."""


def check_divergence(trial_id: str, history: Sequence[Point], point: Point,
                     health: SweepHealthConfig, now: float, best: float | None = None, *,
                     metric: str = "loss") -> Verdict | None:
    """The first watched metric is worse than ``divergence_factor`` x the trial's own best
    and x its rolling median (``history`` excludes ``point``; ``best``, when given, is the
    best value seen before ``history``'s window too). Defined for positive metrics
    (losses, accuracies); a best or median <= 0 skips the check."""
    factor = health.divergence_factor
    name = metric
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


def intervals(points: Sequence[Point]) -> list[float]:
    """Seconds each result took: its ``interval_s`` or the gap to the result before it."""
    out: list[float] = []
    for before, point in zip(points, points[1:], strict=False):
        gap = point.interval_s if point.interval_s is not None else point.time - before.time
        out.append(max(gap, 0.0))
    return out


def recent_count(health: SweepHealthConfig) -> int:
    """How many consecutive slow results make a collapse."""
    return max(RECENT_INTERVALS, health.window // 4)


def check_throughput(trial_id: str, points: Sequence[Point], health: SweepHealthConfig,
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


def check_memory(trial_id: str, points: Sequence[Point], health: SweepHealthConfig,
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
                 health: SweepHealthConfig, now: float, best: float | None = None, *,
                 watch: Sequence[str] = ("loss",)) -> Verdict | None:
    """All result checks in order of severity; the first unhealthy verdict, else ``None``.
    ``history`` holds the trial's earlier points (not ``point``), ``best`` the best value of
    the first watched metric seen before them (optional); ``watch``: the watched metrics
    (``HealthConfig.watch_metrics``; divergence judges the first)."""
    verdict = check_nonfinite(trial_id, point, watch, now)
    if verdict is not None:
        return verdict
    series = [*history, point]
    return (check_divergence(trial_id, history, point, health, now, best, metric=watch[0])
            or check_throughput(trial_id, series, health, now)
            or check_memory(trial_id, series, health, now))


