"""The checkpoint interval planner on a fake clock: Young/Daly's formula, the MTBF estimate,
the decisions, and two runs simulated with failures every N seconds: the chosen interval
stays within 20% of Daly's optimum for the measured cost, and the policy's goodput is at
least that of the best of three fixed intervals."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from rayguard.checkpoint.interval import (
    DEFAULT_MTBF_S,
    IntervalBounds,
    IntervalPolicy,
    bounded_interval,
    daly_interval,
    estimate_mtbf,
    young_interval,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_young_and_daly():
    assert young_interval(10, 3600) == pytest.approx(math.sqrt(72000))
    ratio = 10 / 7200
    expected = math.sqrt(72000) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - 10
    assert daly_interval(10, 3600) == pytest.approx(expected)
    assert daly_interval(10, 3600) == pytest.approx(young_interval(10, 3600), rel=0.05)
    assert daly_interval(100, 40) == 40  # C >= 2M: checkpoint once per MTBF


def test_the_mtbf_starts_at_the_prior_and_tends_to_the_observed_rate():
    assert estimate_mtbf(0, 0) == DEFAULT_MTBF_S
    assert estimate_mtbf(3600, 0) > DEFAULT_MTBF_S  # an hour without failure: longer
    assert estimate_mtbf(100 * 600, 100) == pytest.approx(600, rel=0.1)
    assert estimate_mtbf(10 * 600, 10, prior_s=600) == pytest.approx(600)  # a true prior stays exact


def test_a_failure_free_stretch_adds_to_the_prior_second_for_second():
    # not T / PRIOR_WEIGHT: 13 s without a fault must not claim a 260 s longer MTBF
    assert estimate_mtbf(13, 0, prior_s=80) == pytest.approx(93)
    assert estimate_mtbf(0, 0, prior_s=80) == 80
    # the first failure brings the estimate down to what was seen
    assert estimate_mtbf(20, 1, prior_s=80) < estimate_mtbf(20, 0, prior_s=80) / 3


def test_the_open_stretch_since_the_last_failure_counts_only_once_it_is_longer():
    # failures every 20 s: 3 closed gaps; Poisson's estimate climbs between two failures
    assert estimate_mtbf(60, 3, prior_s=20, at_last_failure_s=60) == pytest.approx(20)
    for since in (0.0, 5.0, 15.0, 19.9):
        assert estimate_mtbf(60 + since, 3, prior_s=20,
                             at_last_failure_s=60) == pytest.approx(20)
        assert estimate_mtbf(60 + since, 3, prior_s=20) == pytest.approx(20 + since / 3.05,
                                                                          rel=0.01)
    # a stretch longer than the gaps seen raises it: as if a failure came now
    assert estimate_mtbf(60 + 40, 3, prior_s=20, at_last_failure_s=60) == pytest.approx(
        (0.05 * 20 + 100) / 4.05)
    # the last failure cannot lie past the time observed
    assert estimate_mtbf(10, 1, prior_s=20, at_last_failure_s=50) == estimate_mtbf(
        10, 1, prior_s=20, at_last_failure_s=10)
    assert estimate_mtbf(60, 0, prior_s=20, at_last_failure_s=30) == 80  # no failure: prior + T


def test_an_attempt_starts_from_the_runs_costs_and_counts_from_the_restore():
    clock = Clock()
    bounds = IntervalBounds(0.5, 600, prior_mtbf_s=20)
    fresh = IntervalPolicy(bounds, observed_s=40, failures=2, at_last_failure_s=40, clock=clock)
    known = IntervalPolicy(bounds, observed_s=40, failures=2, at_last_failure_s=40,
                           costs_s=[0.3, 0.2] + [0.25] * 40, clock=clock)
    clock.t = 1.0
    assert fresh.decide().due and fresh.decide().cost_s is None  # measures the cost first
    decision = known.decide()
    assert known.cost_s == pytest.approx(0.25) and not decision.due  # the last 32 costs
    assert decision.interval_s == pytest.approx(daly_interval(0.25, 20))
    clock.t = 2.0
    known.resumed()  # set-up and load took 2 s: the interval counts from here
    clock.t = 2.0 + decision.interval_s - 0.01
    assert not known.decide().due
    clock.t += 0.02
    assert known.decide().due
    # a failure seen by the policy closes a gap
    known.failed()
    assert known.mtbf_s() == pytest.approx((0.05 * 20 + 40 + clock.t) / 3.05)


def test_bounds_and_the_first_interval():
    bounds = IntervalBounds(min_interval_s=60, max_interval_s=3600)
    assert bounded_interval(None, 86400, bounds) == 60  # no cost yet: soon, to measure it
    assert bounded_interval(0.001, 600, bounds) == 60
    assert bounded_interval(100, 86400, bounds) == 3600
    assert bounded_interval(10, 1800, bounds) == pytest.approx(daly_interval(10, 1800))


def test_a_decision_on_a_fake_clock():
    clock = Clock()
    policy = IntervalPolicy(IntervalBounds(10, 100, prior_mtbf_s=50), clock=clock)
    clock.t = 9.0
    first = policy.decide()
    assert not first.due and first.interval_s == 10 and first.cost_s is None
    clock.t = 10.0
    assert policy.decide().due
    policy.saved(2.0)
    decision = policy.decide()
    assert not decision.due and decision.since_last_s == 0 and decision.cost_s == 2.0
    assert decision.interval_s == pytest.approx(daly_interval(2.0, policy.mtbf_s()))
    clock.t += 100  # the bound (the MTBF estimate grows with the time run without failure)
    assert policy.decide().due
    assert not policy.decide(in_flight=True).due  # async: never while one persists
    policy.persisted(150.0)  # persisting takes longer than the interval: pace to it
    assert policy.decide().interval_s == 150.0 and not policy.decide().due


# -- a run simulated: work in steps, a checkpoint blocks C, a failure loses the work since
# the last checkpoint and costs a restart ------------------------------------------------
Due = Callable[[float, float], bool]
"""(wall time, seconds since the last checkpoint) -> checkpoint now?"""


def simulate(due: Due, *, failures: list[float], cost_s: float, horizon_s: float,
             restart_s: float = 30.0, step_s: float = 5.0,
             on_save: Callable[[], None] = lambda: None,
             on_failure: Callable[[], None] = lambda: None,
             clock: Clock | None = None) -> float:
    """The goodput (work committed / wall time) of a run whose loop checkpoints when
    ``due``; ``failures``: wall times of the failures."""
    clock = clock or Clock()
    t = committed = pending = 0.0
    last = 0.0
    upcoming = iter(failures)
    next_failure = next(upcoming, math.inf)
    while t < horizon_s:
        clock.t = t
        saving = due(t, t - last)
        t += cost_s if saving else step_s
        if t >= next_failure:  # the work since the last checkpoint (and this save) is lost
            t = next_failure + restart_s
            pending, last = 0.0, t
            next_failure = next(upcoming, math.inf)
            clock.t = t
            on_failure()
        elif saving:
            committed, pending, last = committed + pending, 0.0, t
            clock.t = t
            on_save()
        else:
            pending += step_s
    return committed / t


def _policy_run(failures: list[float], cost_s: float, horizon_s: float,
                prior_s: float = DEFAULT_MTBF_S) -> tuple[float, IntervalPolicy, list]:
    clock = Clock()
    policy = IntervalPolicy(IntervalBounds(60, 3600, prior_s), clock=clock)
    decisions: list = []

    def due(t: float, since: float) -> bool:
        decision = policy.decide()
        decisions.append((policy.failures, decision))
        return decision.due

    goodput = simulate(due, failures=failures, cost_s=cost_s, horizon_s=horizon_s,
                       on_save=lambda: policy.saved(cost_s), on_failure=policy.failed,
                       clock=clock)
    return goodput, policy, decisions


@pytest.mark.parametrize(("prior_s", "warm"), [(DEFAULT_MTBF_S, 10), (1800.0, 1)],
                         ids=["24h-prior", "true-prior"])
def test_with_failures_every_n_seconds_the_interval_is_within_20_percent_of_daly(prior_s, warm):
    n, cost = 1800.0, 20.0
    failures = [n * (k + 1) for k in range(60)]
    _, policy, decisions = _policy_run(failures, cost, horizon_s=60 * n, prior_s=prior_s)
    optimum = daly_interval(cost, n)
    assert policy.cost_s == cost and policy.failures >= 59
    # the estimate settles after a few failures (the prior gives way; before that a span
    # without failure is all it knows)
    measured = [d for seen, d in decisions if seen >= warm and d.cost_s is not None]
    assert len(measured) > 1000
    worst = max(abs(d.interval_s - optimum) / optimum for d in measured)
    assert worst <= 0.20, (worst, optimum)


def test_the_policy_goodput_is_at_least_the_best_of_three_fixed_intervals():
    n, cost, horizon = 1800.0, 20.0, 200 * 1800.0
    rng = random.Random(7)
    failures, t = [], 0.0
    while t < horizon * 1.1:
        t += rng.expovariate(1 / n)
        failures.append(t)
    fixed = {interval: simulate(lambda t, since, i=interval: since >= i, failures=failures,
                                cost_s=cost, horizon_s=horizon)
             for interval in (120.0, 600.0, 1800.0)}
    adaptive, policy, _ = _policy_run(failures, cost, horizon)
    assert adaptive >= max(fixed.values()), (adaptive, fixed)
    assert policy.mtbf_s() == pytest.approx(n, rel=0.2)
