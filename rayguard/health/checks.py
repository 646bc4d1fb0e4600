"""Health checks over observations: pure functions, verdicts as data.

An observation is a :class:`Point` (a worker's report, a trial's result). Each check returns
a :class:`Verdict` when what it watches is unhealthy, ``None`` when it is not; nothing here
touches Ray. Both hosts call these: a worker (:mod:`rayguard.health.watchdog`, the NaN guard
of the session, through :mod:`rayguard.health.decisions`) and a sweep
(:mod:`rayguard.tune.callback`). Checks over a whole series are in
:mod:`rayguard.health.series`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

NONFINITE = "nonfinite"
DIVERGENCE = "divergence"
STALL = "stall"
STARTUP = "startup"
THROUGHPUT = "throughput_collapse"
MEMORY = "memory_growth"
CHECKS = (NONFINITE, DIVERGENCE, STALL, THROUGHPUT, MEMORY)

@dataclass(frozen=True)
class Verdict:
    """One check found a trial unhealthy."""

    trial_id: str
    """Who was judged: the trial's id in a sweep (``""`` in a training run's worker)."""
    check: str
    """One of :data:`CHECKS`."""
    metric: str | None
    """The metric judged (``None`` for stall and throughput)."""
    value: float
    """The observed value (the metric, seconds without a result, or results per second)."""
    threshold: float
    """The limit the value crossed."""
    since_iteration: int
    """First ``training_iteration`` (a worker: step) judged bad: a restart uses a checkpoint
    from before it."""
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


def check_stall(trial_id: str, last_progress: float, now_monotonic: float, timeout_s: float,
                last_iteration: int = 0, now: float | None = None, *,
                bound: str = STALL) -> Verdict | None:
    """No progress (a result, a report, a heartbeat) for longer than ``timeout_s`` seconds.
    ``bound``: ``"stall"`` (the stall timeout, from the first step on) or ``"startup"`` (no
    step completed yet); the verdict's ``check`` names it."""
    silent = now_monotonic - last_progress
    if silent <= timeout_s:
        return None
    if bound == STARTUP:
        detail = (f"no first step {silent:.1f} s after start-up "
                  f"(start-up timeout {timeout_s:.1f} s, HealthConfig.startup_timeout_s)")
    else:
        detail = (f"no progress for {silent:.1f} s "
                  f"(stall timeout {timeout_s:.1f} s, HealthConfig.stall_timeout_s)")
    if last_iteration:
        detail += f" after iteration {last_iteration}"
    return Verdict(trial_id, bound, None, silent, timeout_s, last_iteration + 1,
                   time.time() if now is None else now, detail)


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
