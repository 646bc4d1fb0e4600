"""The checkpoint interval by the numbers: Young/Daly from the measured cost and failure rate.

A checkpoint every ``tau`` seconds of work costs ``C / tau`` of the run (the loop blocked
``C`` seconds per checkpoint) and loses on average ``tau / 2`` of work per failure, one
failure every ``M`` seconds. Young's first-order optimum is ``tau = sqrt(2 C M)``; Daly's
higher-order one, used here, is

    tau = sqrt(2 C M) * (1 + sqrt(C / (2 M)) / 3 + C / (9 * 2 M)) - C    when C < 2 M
    tau = M                                                              otherwise

bounded by ``CheckpointConfig(min_interval_s, max_interval_s)``.

``C`` is the mean blocked time of the checkpoints measured in this attempt (sync: the whole
save, inside ``report``; async: the agreement and the snapshot, without the wait for the
previous save). In async mode the interval is never shorter than the previous checkpoint's
persist time, and never due while a checkpoint is in flight.

``M`` is a Gamma-Poisson (Bayesian) estimate of the mean time between failures, from the
gaps the failures closed, with the open stretch since the last one as a lower bound:

    M = max((w * prior + T_k) / (w + k), (w * prior + T) / (w + k + 1))

``T``: seconds the run directory has run (earlier runs and this one), ``T_k``: of them, the
seconds up to the last failure, ``k``: failures seen (restarts), ``prior``:
``CheckpointConfig(mtbf_s)`` (default 24 h), ``w``: the prior's weight in failures
(:data:`PRIOR_WEIGHT`); with failures every ``N`` seconds it is ``N`` from the first
failure on. The stretch since the last failure raises the estimate only once it is longer
than the gaps seen (then as if a failure came now). Poisson's own estimate
``(w * prior + T) / (w + k)`` counts that open stretch as if it were closed: between two
failures it climbs from ``N`` towards ``2 N``, so a run whose failures come every ``N``
seconds checkpointed up to 40% less often than Daly's optimum just before each failure, and
only settled after some ten failures. With no failure seen yet, ``M = prior + T``: the run's
failure-free time adds to the prior second for second. (``T / w`` would add twenty seconds
per second: a failure-free minute would claim a twenty-minute MTBF, and a run whose faults
come every few minutes took one checkpoint and then none until its first fault.)

``C`` starts, in every attempt after the first, from the costs of the checkpoints the run
directory's log recorded (:mod:`rayguard.train.pacing`), so an attempt does not spend a
checkpoint at the minimum interval to measure what the run already knows; the interval
counts from the restore (:meth:`IntervalPolicy.resumed`), not from the attempt's set-up.

Pure: no Ray, the clock is injected. The worker's adapter is :mod:`rayguard.train.pacing`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_MTBF_S = 24 * 3600.0
"""The prior MTBF when ``CheckpointConfig(mtbf_s=None)``: a day (conservative: few
checkpoints until the run shows failures)."""

KEPT_COSTS = 32
"""How many recent checkpoint costs the mean takes (the state grows, storage changes)."""

PRIOR_WEIGHT = 0.05
"""The prior counts as 1/20 of a failure over 1/20 of the prior MTBF (72 min at 24 h): a
handful of observed failures outweigh it, and a prior equal to the truth stays exact."""


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the work between checkpoints (seconds)."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return young_interval(cost_s, mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def estimate_mtbf(observed_s: float, failures: int, *, prior_s: float = DEFAULT_MTBF_S,
                  prior_weight: float = PRIOR_WEIGHT,
                  at_last_failure_s: float | None = None) -> float:
    """The MTBF after ``failures`` in ``observed_s`` seconds (``at_last_failure_s``: of them,
    the seconds up to the last failure; ``None``: Poisson's ``(w * prior + T) / (w + k)``);
    ``prior + T`` before the first failure (see the module docstring)."""
    observed = max(0.0, observed_s)
    if failures <= 0:
        return prior_s + observed
    prior = prior_weight * prior_s
    if at_last_failure_s is None:
        return (prior + observed) / (prior_weight + failures)
    closed = min(max(0.0, at_last_failure_s), observed)
    return max((prior + closed) / (prior_weight + failures),
               (prior + observed) / (prior_weight + failures + 1))


@dataclass(frozen=True)
class IntervalDecision:
    """Whether a checkpoint is due now, and the figures behind it."""

    due: bool
    interval_s: float
    """The interval in force (Daly's, bounded; async: at least the last persist time)."""
    cost_s: float | None
    """The mean measured checkpoint cost (``None``: none measured yet)."""
    mtbf_s: float
    since_last_s: float
    """Seconds since the last checkpoint (or since the attempt started)."""
    reason: str


@dataclass(frozen=True)
class IntervalBounds:
    """``CheckpointConfig``'s figures for the policy."""

    min_interval_s: float = 60.0
    max_interval_s: float = 3600.0
    prior_mtbf_s: float = DEFAULT_MTBF_S


def bounded_interval(cost_s: float | None, mtbf_s: float, bounds: IntervalBounds) -> float:
    """Daly's interval for ``cost_s`` within the bounds (no cost measured: the minimum, so
    that the first checkpoint comes soon and measures it)."""
    if cost_s is None:
        return bounds.min_interval_s
    return min(bounds.max_interval_s, max(bounds.min_interval_s, daly_interval(cost_s, mtbf_s)))


class IntervalPolicy:
    """One run's checkpoint pacing: told of each checkpoint (its cost) and of the failures
    before it started; asked whether a checkpoint is due. ``clock``: seconds, monotonic."""

    def __init__(self, bounds: IntervalBounds = IntervalBounds(), *, observed_s: float = 0.0,
                 failures: int = 0, at_last_failure_s: float | None = None,
                 costs_s: Sequence[float] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``observed_s``, ``failures``, ``at_last_failure_s``: the run directory's history
        before this attempt (``at_last_failure_s``: the seconds of ``observed_s`` up to the
        last failure; ``None`` with failures: all of them, the attempt started at a
        failure); ``costs_s``: the costs of its earlier checkpoints."""
        self.bounds = bounds
        self.clock = clock
        self.failures = failures
        self._observed_before_s = observed_s
        self._at_last_failure_s = observed_s if at_last_failure_s is None else at_last_failure_s
        self._started = clock()
        self._last = self._started
        self._costs: list[float] = [max(0.0, float(c)) for c in costs_s][-KEPT_COSTS:]
        self.persist_s: float | None = None
        """The previous async checkpoint's persist time."""

    # -- what happened --------------------------------------------------------------------
    def saved(self, cost_s: float, persist_s: float | None = None) -> None:
        """Every rank saved a checkpoint just now; the loop was blocked ``cost_s``."""
        self._costs.append(max(0.0, cost_s))
        del self._costs[:-KEPT_COSTS]  # the recent ones: the state grows, storage changes
        self._last = self.clock()
        if persist_s is not None:
            self.persist_s = persist_s

    def persisted(self, persist_s: float) -> None:
        """The checkpoint in flight finished persisting after ``persist_s``."""
        self.persist_s = persist_s

    def failed(self) -> None:
        """A failure (a simulation's restart; a worker learns them at set-up)."""
        self.failures += 1
        self._at_last_failure_s = self.observed_s
        self._last = self.clock()

    def resumed(self) -> None:
        """The state was restored just now: the interval counts the work from here (not the
        attempt's set-up and load)."""
        self._last = self.clock()

    # -- the figures ----------------------------------------------------------------------
    @property
    def cost_s(self) -> float | None:
        return sum(self._costs) / len(self._costs) if self._costs else None

    @property
    def observed_s(self) -> float:
        return self._observed_before_s + self.clock() - self._started

    def mtbf_s(self) -> float:
        return estimate_mtbf(self.observed_s, self.failures, prior_s=self.bounds.prior_mtbf_s,
                             at_last_failure_s=self._at_last_failure_s)

    def decide(self, *, in_flight: bool = False) -> IntervalDecision:
        """Whether a checkpoint is due now (``in_flight``: an async save still persists)."""
        cost, mtbf = self.cost_s, self.mtbf_s()
        interval = bounded_interval(cost, mtbf, self.bounds)
        if self.persist_s is not None and self.persist_s > interval:
            interval = self.persist_s
        since = self.clock() - self._last
        if in_flight:
            return IntervalDecision(False, interval, cost, mtbf, since,
                                    "the previous checkpoint is still persisting")
        due = since >= interval
        what = ("no cost measured yet: the first checkpoint measures it" if cost is None
                else f"Daly's interval for cost {cost:.3g} s and MTBF {mtbf:.4g} s")
        return IntervalDecision(due, interval, cost, mtbf, since,
                                f"{'due' if due else 'not due'}: {since:.3g} s of "
                                f"{interval:.3g} s ({what})")
