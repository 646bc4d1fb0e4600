"""Worker-side step timing and the straggler rule, on fake clocks (no Ray)."""

from __future__ import annotations

import random

import pytest

from rayguard import HealthConfig
from rayguard.exceptions import ConfigError
from rayguard.observe.steps import StepTimer
from rayguard.observe.straggler import StragglerDetector, describe


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_step_timer_sends_first_report_then_at_most_every_interval():
    clock = Clock()
    timer = StepTimer(interval_s=5.0, clock=clock, wall=clock)
    first = timer.on_report(0, {"loss": 1.0}, blocked_s=0.0)
    assert first is not None and first["reports"] == 1 and first["intervals"] == 0
    sent = []
    for step in range(1, 20):
        clock.t += 0.5
        s = timer.on_report(step, {"loss": 1.0 / step}, blocked_s=0.1)
        if s:
            sent.append(s)
    assert len(sent) == 1  # 9.5 s of reports, one summary after 5 s
    s = sent[0]
    assert s["intervals"] == s["reports"] == 10
    assert s["step_time_sum_s"] == pytest.approx(10 * 0.4)  # report blocking is not step time
    assert s["blocked_sum_s"] == pytest.approx(10 * 0.1)
    assert s["first_step"] == 1 and s["last_step"] == 10
    rest = timer.take()
    assert rest["first_step"] == 11 and rest["last_step"] == 19
    assert timer.take() is None


def test_step_timer_thins_samples_and_keeps_non_finite_as_text():
    clock = Clock()
    timer = StepTimer(interval_s=1e9, clock=clock, wall=clock, max_samples=8)
    timer.on_report(0, {"loss": 0.0}, 0.0)
    for step in range(1, 1000):
        timer.on_report(step, {"loss": float(step)}, 0.0)
    timer.on_report(1000, {"loss": float("nan")}, 0.0)
    samples = timer.take()["samples"]
    assert len(samples) < 16 and samples[0][0] == 1
    steps = [s[0] for s in samples]
    assert steps == sorted(steps)


def _feed(detector, means, seconds, interval=1.0, noise=0.0, rng=None):
    flagged = []
    t = 0.0
    while t < seconds:
        t += interval
        for rank, mean in enumerate(means):
            step_s = mean * (1 + (rng.uniform(-noise, noise) if rng else 0.0))
            n = max(int(interval / step_s), 1)
            flagged += detector.add(rank=rank, attempt=0, time=t, intervals=n,
                                    step_time_sum_s=n * step_s, node=f"node{rank}",
                                    gpu_ids=(str(rank),), first_time=0.0)
    return flagged


def test_a_rank_three_times_slower_is_flagged_once_after_a_window():
    detector = StragglerDetector(threshold=1.5, window_s=10.0)
    assert _feed(detector, [0.01, 0.03], seconds=9.0) == []  # not observed for a window yet
    flagged = _feed(detector, [0.01, 0.03], seconds=30.0)
    assert [v.rank for v in flagged] == [1]
    assert flagged[0].score == pytest.approx(3.0, rel=0.05)
    assert "rank 1" in describe(flagged[0]) and "GPU 1" in describe(flagged[0])


def test_balanced_noisy_runs_are_never_flagged():
    rng = random.Random(0)
    for _ in range(20):
        detector = StragglerDetector(threshold=1.5, window_s=10.0)
        assert _feed(detector, [0.01] * 4, seconds=60.0, noise=0.3, rng=rng) == []


def test_a_new_attempt_starts_afresh_and_none_turns_detection_off():
    detector = StragglerDetector(threshold=1.5, window_s=5.0)
    assert _feed(detector, [0.01, 0.03], seconds=10.0)
    detector.add(rank=0, attempt=1, time=100.0, intervals=1, step_time_sum_s=0.01)
    assert detector.scores() == {}
    off = StragglerDetector(threshold=None, window_s=5.0)
    assert _feed(off, [0.01, 0.05], seconds=20.0) == [] and off.scores()[1] > 4


@pytest.mark.parametrize("kwargs, needle", [
    ({"straggler_threshold": 1.0}, "HealthConfig(straggler_threshold=1.0)"),
    ({"straggler_threshold": True}, "HealthConfig(straggler_threshold=True)"),
    ({"straggler_window_s": 0}, "HealthConfig(straggler_window_s=0)"),
    ({"step_summary_interval_s": float("inf")}, "HealthConfig(step_summary_interval_s=inf)"),
    ({"step_summary_interval_s": 10.0, "straggler_window_s": 5.0}, "straggler_window_s=5.0"),
])
def test_health_config_timing_fields_are_validated(kwargs, needle):
    with pytest.raises(ConfigError, match="Fix") as info:
        HealthConfig(**kwargs)
    assert needle in str(info.value)


def test_health_config_timing_defaults():
    h = HealthConfig()
    assert (h.step_summary_interval_s, h.straggler_threshold, h.straggler_window_s) == (5.0, 1.5, 60.0)
    assert HealthConfig(straggler_threshold=None).straggler_threshold is None


def test_step_timer_times_the_replayed_steps_apart():
    clock = Clock()
    timer = StepTimer(interval_s=100.0, clock=clock, wall=clock)
    timer.replaying(12)  # restored at step 9: steps 10..12 run again
    timer.on_report(10, {}, blocked_s=0.0)  # the first report: the planner's to time
    for step, dt in ((11, 2.0), (12, 3.0), (13, 0.5), (14, 0.5)):
        clock.t += dt
        timer.on_report(step, {}, blocked_s=0.0)
    s = timer.take()
    assert s["replay_time_s"] == pytest.approx(5.0) and s["replay_steps"] == 2
    assert s["step_time_sum_s"] == pytest.approx(6.0)
    clock.t += 0.5
    timer.on_report(12, {}, blocked_s=0.0)  # past the replay: a later step 12 is no replay
    assert "replay_steps" not in timer.take()


def test_step_timer_without_a_replay_sends_no_replay_fields():
    clock = Clock()
    timer = StepTimer(interval_s=100.0, clock=clock, wall=clock)
    timer.replaying(None)
    for step in range(3):
        clock.t += 1.0
        timer.on_report(step, {}, blocked_s=0.0)
    assert "replay_time_s" not in timer.take()
