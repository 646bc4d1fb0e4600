"""A run's failure history and the interval it should have checkpointed at, from its event log.

Two readers of ``rayguard_events.jsonl`` (the events as :func:`rayguard.events.read` returns
them):

- :func:`failure_history`: seconds run and failures (``restart`` events) in a run
  directory, earlier runs included, and the costs of its recent checkpoints; rank 0 of
  each attempt starts its interval policy from it (:mod:`rayguard.train.pacing`);
- :func:`recommend_interval`: for a loop that checkpoints on its own schedule (a
  framework's ``save_steps``), the interval that would have maximised goodput, from the
  mean measured checkpoint cost and the failures over wall time, next to the interval the
  loop used, with the figures (:class:`Recommendation`).

A run is the span from a ``start`` event to the last event before the next ``start`` (the
time between runs in the same directory is not run time). Pure: no Ray, no files.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rayguard.checkpoint.interval import (
    DEFAULT_MTBF_S,
    KEPT_COSTS,
    IntervalBounds,
    bounded_interval,
    daly_interval,
    estimate_mtbf,
)

logger = logging.getLogger("rayguard")

FAILURE_KINDS = frozenset({"restart"})
"""One event per failure survived (``worker_died`` comes once per rank)."""


@dataclass(frozen=True)
class FailureHistory:
    observed_s: float
    """Seconds the runs of this directory ran (up to ``now`` for the last one)."""
    failures: int
    runs: int
    at_last_failure_s: float | None = None
    """Of ``observed_s``, the seconds up to the last failure (``None``: no failure)."""
    costs_s: tuple[float, ...] = ()
    """The measured costs of the last :data:`~rayguard.checkpoint.interval.KEPT_COSTS`
    committed checkpoints, oldest first (a checkpoint reported through ``ray.train.report``
    has none)."""



def _time(event: dict[str, Any]) -> float | None:
    value = event.get("time")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _runs(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The events split at each ``start`` (events before the first start: one run)."""
    runs: list[list[dict[str, Any]]] = []
    for event in events:
        if _time(event) is None:
            continue
        if event.get("kind") == "start" or not runs:
            runs.append([])
        runs[-1].append(event)
    return runs


def failure_history(events: Iterable[dict[str, Any]], now: float | None = None) -> FailureHistory:
    """Seconds run and failures seen in a run directory's log (``now``: wall-clock time, the
    end of the last run while it still runs). One pass over ``events`` in file order, in
    constant memory (a stream of a long log is never held)."""
    observed, failures, runs = 0.0, 0, 0
    low = high = None
    at_last: float | None = None
    costs: deque[float] = deque(maxlen=KEPT_COSTS)
    for event in events:
        t = _time(event)
        if t is None:
            continue
        if event.get("kind") == "start" or low is None:
            if low is not None and high is not None:
                observed += high - low
            runs, low, high = runs + 1, t, t
        low, high = min(low, t), max(high if high is not None else t, t)
        if event.get("kind") in FAILURE_KINDS:
            failures += 1
            at_last = observed + t - low
        elif event.get("kind") == "checkpoint_committed":
            cost = _cost(event)
            if cost is not None:
                costs.append(cost)
    if low is not None and high is not None:
        observed += (high if now is None else max(high, now)) - low
    return FailureHistory(observed, failures, runs, at_last, tuple(costs))


@dataclass(frozen=True)
class Recommendation:
    """The checkpoint interval that would have maximised goodput, and what it came from."""

    interval_s: float | None
    """Daly's interval for ``cost_s`` and ``mtbf_s``, bounded (``None``: no checkpoint cost
    was measured)."""
    cost_s: float | None
    """Mean blocked seconds of a committed checkpoint."""
    mtbf_s: float
    observed_s: float
    failures: int
    checkpoints: int
    used_interval_s: float | None
    """Mean seconds between the run's checkpoints (``None``: fewer than two)."""
    unbounded_s: float | None
    """Daly's interval without the configured bounds."""

    def to_dict(self) -> dict[str, Any]:
        """The figures, for ``--json`` and the report."""
        return dict(vars(self))

    def line(self) -> str:
        """One line for a report or the driver's last line."""
        if self.interval_s is None or self.cost_s is None:
            return "checkpoint interval: no checkpoint cost measured"
        used = ("" if self.used_interval_s is None
                else f"; this run checkpointed every {_seconds(self.used_interval_s)}")
        return (f"checkpoint interval: {self.interval_s:.0f} s maximises goodput (Daly: cost "
                f"{self.cost_s:.2f} s, MTBF {self.mtbf_s:.0f} s from {self.failures} "
                f"failure(s) in {self.observed_s:.0f} s){used}")


def advice_matters(advice: Recommendation, min_interval_s: float) -> bool:
    """Whether the driver's last lines show ``advice``: the run saw a failure, or ran long
    enough for its checkpoint interval to matter (longer than the shortest interval the
    policy asks for, ``CheckpointConfig.min_interval_s``); never without a measured cost."""
    if advice.interval_s is None or advice.cost_s is None:
        return False
    return advice.failures > 0 or advice.observed_s > max(min_interval_s, 1.0)


def _seconds(value: float) -> str:
    """``60 s``; a sub-10-second figure keeps two significant digits (``0.05 s``, not
    ``0 s``)."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    try:
        return float(value) if ok else None
    except OverflowError:  # an int past the float range
        return None


def _cost(event: dict[str, Any]) -> float | None:
    """The blocked seconds of a committed checkpoint (async: ``blocked_s`` without the wait
    for the previous one, ``backpressure_s``; sync: the whole save, ``seconds``); ``None``
    for one reported through ``ray.train.report`` (not measured)."""
    blocked = _number(event.get("blocked_s"))
    if blocked is not None:
        return max(0.0, blocked - (_number(event.get("backpressure_s")) or 0.0))
    return _number(event.get("seconds"))


def interval_settings(checkpoint: Any) -> dict[str, float]:
    """What a run's ``start`` event says of its ``CheckpointConfig`` (``interval_settings``),
    so that ``rayguard events --goodput`` and the report advise with the run's own prior
    and bounds, as the driver's last line does."""
    values = {"mtbf_s": checkpoint.mtbf_s, "min_interval_s": checkpoint.min_interval_s,
              "max_interval_s": checkpoint.max_interval_s}
    return {k: float(v) for k, v in values.items() if v is not None}  # mtbf_s None: the default


MAX_LOGGED_S = 10 * 365 * 86400.0
"""The largest figure of a logged ``interval_settings`` believed (ten years): beyond it the
advice would print absurd numbers, so the default is used instead."""


def _logged_settings(events: list[dict[str, Any]]) -> dict[str, float]:
    """The newest ``start`` event's ``interval_settings``, each checked as
    ``CheckpointConfig`` checks it (``mtbf_s`` > 0, the bounds >= 0, finite, min <= max) and
    at most :data:`MAX_LOGGED_S`; a figure that fails is left out (its default applies) with
    a warning naming it. Anyone who can write the run directory can write the log."""
    for event in reversed(events):
        if event.get("kind") == "start" and isinstance(event.get("interval_settings"), dict):
            return checked_settings(event["interval_settings"])
    return {}


def checked_settings(raw: dict[Any, Any]) -> dict[str, float]:
    """The valid figures of a logged ``interval_settings`` (see :func:`_logged_settings`)."""
    out: dict[str, float] = {}
    for key in ("mtbf_s", "min_interval_s", "max_interval_s"):
        if key not in raw:
            continue
        value = _number(raw[key])
        low_ok = value is not None and (value > 0 if key == "mtbf_s" else value >= 0)
        if value is not None and low_ok and math.isfinite(value) and value <= MAX_LOGGED_S:
            out[key] = value
        else:
            _ignored(key, raw[key], f"must be a number of seconds {'>' if key == 'mtbf_s' else '>='}"
                     f" 0 and <= {MAX_LOGGED_S:.0f}")
    if out.get("min_interval_s", 60.0) > out.get("max_interval_s", 3600.0):
        _ignored("min_interval_s", out.get("min_interval_s", 60.0),
                 f"must be <= max_interval_s={out.get('max_interval_s', 3600.0)!r} (both "
                 "bounds dropped)")
        out.pop("min_interval_s", None), out.pop("max_interval_s", None)
    return out


def _ignored(key: str, value: Any, why: str) -> None:
    logger.warning("rayguard: the run's start event has interval_settings.%s=%s: %s; the "
                   "default is used. Fix: check who wrote the run directory's event log "
                   "(the run writes CheckpointConfig's validated figures)",
                   key, ascii(value)[:40], why)


def recommend_interval(events: Iterable[dict[str, Any]], *, mtbf_s: float | None = None,
                       min_interval_s: float | None = None,
                       max_interval_s: float | None = None) -> Recommendation:
    """The interval that would have maximised this log's goodput (``mtbf_s``: the prior, as
    ``CheckpointConfig(mtbf_s)``; the bounds as ``CheckpointConfig``'s; each not given: as
    the run's ``start`` event recorded it, else the defaults: a 24 h prior, 60 s to 1 h)."""
    events = [e for e in events if isinstance(e, dict)]
    logged = _logged_settings(events)
    mtbf_s = logged.get("mtbf_s") if mtbf_s is None else mtbf_s
    min_interval_s = logged.get("min_interval_s", 60.0) if min_interval_s is None else min_interval_s
    max_interval_s = logged.get("max_interval_s", 3600.0) if max_interval_s is None else max_interval_s
    history = failure_history(events)
    commits = [e for e in events if e.get("kind") == "checkpoint_committed"]
    costs = [c for c in map(_cost, commits) if c is not None]
    cost = sum(costs) / len(costs) if costs else None
    mtbf = estimate_mtbf(history.observed_s, history.failures,
                         prior_s=DEFAULT_MTBF_S if mtbf_s is None else mtbf_s,
                         at_last_failure_s=history.at_last_failure_s)
    bounds = IntervalBounds(min_interval_s, max_interval_s)
    used = _used_interval(events)
    return Recommendation(None if cost is None else bounded_interval(cost, mtbf, bounds), cost,
                          mtbf, history.observed_s, history.failures, len(commits), used,
                          None if cost is None else daly_interval(cost, mtbf))


def _used_interval(events: list[dict[str, Any]]) -> float | None:
    """The mean gap between consecutive commits of the same attempt of the same run (the
    gap over a restart is not the loop's interval)."""
    gaps: list[float] = []
    for run in _runs(events):
        by_attempt: dict[Any, list[float]] = {}
        for event in run:
            if event.get("kind") == "checkpoint_committed":
                by_attempt.setdefault(event.get("attempt"), []).append(float(event["time"]))
        for times in by_attempt.values():
            times.sort()
            gaps.extend(b - a for a, b in zip(times[:-1], times[1:], strict=True))
    return sum(gaps) / len(gaps) if gaps else None
