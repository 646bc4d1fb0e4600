"""Balanced runs are never flagged as stragglers: many simulated runs of equally fast ranks,
each rank's reports timed by the worker's real :class:`StepTimer` and its summaries judged by
the coordinator's real :class:`RunObserver`, as in a run (no Ray).

The jitter, per rank and run: a constant speed within +-5% of its peers, each step's time
log-normal (sigma 0.2), a pause of 2 to 5 steps on 1% of the steps (a collection, the OS
scheduling another process), a start up to 2 s after its peers, and summaries that reach the
coordinator up to 0.2 s after they were sent (in order per rank, not across ranks). Far more
than measured: in the real 2-rank runs (tests/ray/test_observe_straggler.py, 50 ms steps)
a rank's mean step stayed within 1% of its peer's and no step passed 54 ms. The two settings
are that run's (2 ranks, 0.5 s summaries, a 3 s window) and the defaults (``HealthConfig``:
5 s summaries, a 60 s window) on 8 ranks.

The counterparts show that these runs could be flagged: the same simulation with one rank 3x
slower flags that rank, and no other, within a window of its start; and the balanced scores
move (the highest well above 1), so that their staying under the threshold is a margin, not
an absence of noise."""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass

import pytest

from rayguard.observe.observer import RunObserver
from rayguard.observe.steps import StepTimer

SPEED_SPREAD = 0.05
"""A rank's constant speed: within this fraction of 1."""
STEP_SIGMA = 0.2
"""Each step's time: the rank's step times a log-normal factor of this sigma."""
PAUSE_P, PAUSE_STEPS = 0.01, (2.0, 5.0)
"""A pause of this many steps on this fraction of the steps."""
START_SKEW_S = 2.0
DELIVERY_S = 0.2


@dataclass(frozen=True)
class Setting:
    ranks: int
    step_s: float
    steps: int
    interval_s: float
    window_s: float
    runs: int
    threshold: float = 1.5


RAY_TEST = Setting(ranks=2, step_s=0.05, steps=100, interval_s=0.5, window_s=3.0, runs=300)
DEFAULTS = Setting(ranks=8, step_s=0.5, steps=400, interval_s=5.0, window_s=60.0, runs=30)
SETTINGS = pytest.mark.parametrize("setting", [RAY_TEST, DEFAULTS], ids=["ray_test", "defaults"])


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Outcome:
    flagged: list[tuple[int, float]]
    """(rank, time) of each ``straggler`` event."""
    starts: dict[int, float]
    max_score: float
    """The highest score of a rank watched for a whole window."""
    ended: float
    """When the first rank's loop ended."""


def simulate(rng: random.Random, s: Setting, *, slow: int | None = None) -> Outcome:
    """One run: every rank's reports in time order through its StepTimer, every summary
    through the observer in the order it arrives."""
    clock = Clock()
    timers = {r: StepTimer(interval_s=s.interval_s, clock=clock, wall=clock) for r in range(s.ranks)}
    speed = {r: rng.uniform(1 - SPEED_SPREAD, 1 + SPEED_SPREAD) * (3.0 if r == slow else 1.0)
             for r in range(s.ranks)}
    starts = {r: rng.uniform(0.0, START_SKEW_S) for r in range(s.ranks)}
    reports = [(starts[r], r, 0) for r in range(s.ranks)]
    heapq.heapify(reports)
    arrivals: list[tuple[float, int, dict]] = []
    order = itertools.count()
    arrived = dict.fromkeys(range(s.ranks), 0.0)  # one rank's calls reach the actor in order
    ended = float("inf")

    def send(summary: dict | None, rank: int, t: float) -> None:
        if summary is not None:
            summary.update(rank=rank, node=f"node{rank}", attempt=0, gpu_ids=[], time=t)
            arrived[rank] = max(arrived[rank], t + rng.uniform(0.0, DELIVERY_S))
            heapq.heappush(arrivals, (arrived[rank], next(order), summary))

    while reports:
        t, rank, step = heapq.heappop(reports)
        clock.t = t
        send(timers[rank].on_report(step, {"loss": 1.0}, blocked_s=0.0), rank, t)
        if step + 1 == s.steps:
            send(timers[rank].take(), rank, t)  # the session's last summary, at close
            ended = min(ended, t)
            continue
        step_s = s.step_s * speed[rank] * rng.lognormvariate(0.0, STEP_SIGMA)
        if rng.random() < PAUSE_P:
            step_s += s.step_s * rng.uniform(*PAUSE_STEPS)
        heapq.heappush(reports, (t + step_s, rank, step + 1))

    observer = RunObserver("sim", straggler_threshold=s.threshold, straggler_window_s=s.window_s,
                           metrics=None)
    flagged, max_score = [], 0.0
    while arrivals:
        _, _, summary = heapq.heappop(arrivals)
        for event in observer.on_summaries([summary]):
            if event["kind"] == "straggler":
                flagged.append((event["rank"], summary["time"]))
            elif summary["time"] - starts[event["rank"]] >= s.window_s:  # a whole window
                max_score = max(max_score, event["straggler_score"] or 0.0)
    return Outcome(flagged, starts, max_score, ended)


@SETTINGS
def test_balanced_runs_are_never_flagged(setting):
    rng = random.Random(1)
    outcomes = [simulate(rng, setting) for _ in range(setting.runs)]
    assert [o.flagged for o in outcomes if o.flagged] == []
    assert 1.1 < max(o.max_score for o in outcomes) < setting.threshold  # the jitter is seen


@SETTINGS
def test_the_same_runs_with_one_rank_three_times_slower_flag_it_alone(setting):
    rng = random.Random(2)
    slow = setting.ranks - 1
    for _ in range(max(setting.runs // 10, 3)):
        outcome = simulate(rng, setting, slow=slow)
        # judged while every rank's loop runs: the slow rank runs on alone for twice as long,
        # and its peers' windows then hold only their last steps
        assert [rank for rank, t in outcome.flagged if t <= outcome.ended] == [slow]
        # once watched for a window (plus a summary interval and the delivery's delay)
        when = outcome.flagged[0][1] - outcome.starts[slow]
        assert setting.window_s <= when <= setting.window_s + setting.interval_s + 1.0
