"""The first step of an attempt is work: when the step summary says when ``load_state``
returned (``begin_time``), the planner counts the first step at the attempt's measured time
per step (never before ``begin_time``); without it, as before, the first report ends the
start-up or the load."""

from __future__ import annotations

from typing import Any

import pytest

from rayguard.events import make_event
from rayguard.observe.goodput import goodput
from rayguard.observe.steps import StepTimer

T0 = 1_700_000_000.0


def ev(t: float, kind: str, attempt: int | None = None, **fields: Any) -> dict[str, Any]:
    event = make_event(kind, kind, attempt=attempt, **fields)
    event["time"] = T0 + t
    return event


def run(begin: float | None) -> list[dict[str, Any]]:
    """One attempt: load_state returned at ``begin``, the first report at 5, then 90 steps
    of 0.5 s; a kill at 50 after step 90 and a restart whose first report is at 60."""
    extra = {} if begin is None else {"begin_time": T0 + begin}
    extra1 = {} if begin is None else {"begin_time": T0 + 59.8}  # a fast load: 0.2 s to go
    return [ev(0, "start"), ev(1, "attempt_started", 0),
            ev(6, "steps", 0, rank=0, first_step=0, last_step=90, first_time=T0 + 5,
               step_time_sum_s=45.0, intervals=90, **extra),
            ev(50, "fault_injected", 0, step=90, fault="kill"),
            ev(51, "worker_died", 0), ev(52, "restart", 0), ev(58, "attempt_started", 1),
            ev(58.5, "restored", 1, step=89),
            ev(70, "steps", 1, rank=0, first_step=90, last_step=100, first_time=T0 + 60,
               step_time_sum_s=5.0, intervals=10, **extra1),
            ev(80, "finished")]


def test_without_begin_time_the_first_report_ends_the_start_up():
    g = goodput(run(None))
    assert g.badput_s["startup"] == pytest.approx(5)
    assert g.restart_s["load"] == pytest.approx(2)


def test_with_begin_time_the_first_step_is_work_at_the_measured_step_time():
    g = goodput(run(begin=2.0))
    assert g.badput_s["startup"] == pytest.approx(4.5)  # one 0.5 s step before the report
    # the restart: load_state returned 0.2 s before the first report, less than a step
    assert g.restart_s["load"] == pytest.approx(1.8)
    assert g.productive_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)
    assert g.productive_s == pytest.approx(goodput(run(None)).productive_s + 0.5 + 0.2)


def test_the_step_timer_sends_begin_time_with_the_first_report_only():
    wall, clock = [100.0], [0.0]
    timer = StepTimer(interval_s=0.0, clock=lambda: clock[0], wall=lambda: wall[0])
    timer.begin()
    wall[0], clock[0] = 101.0, 1.0
    first = timer.on_report(0, {}, 0.0)
    timer.begin()  # a later load_state: too late, the first step was reported
    wall[0], clock[0] = 102.0, 2.0
    second = timer.on_report(1, {}, 0.0)
    assert first is not None and first["begin_time"] == 100.0 and first["first_time"] == 101.0
    assert second is not None and "begin_time" not in second
    assert "begin_time" not in (StepTimer(interval_s=0.0).on_report(0, {}, 0.0) or {})


def test_an_attempt_too_short_for_a_second_summary_is_timed_from_its_report_events():
    """Attempt 1 sent only its first report's summary (no interval measured); its fault at
    step 40, 16 s later with a 1 s commit between, times its steps: 0.5 s each."""
    events = [ev(0, "start"), ev(1, "attempt_started", 0),
              ev(6, "steps", 0, rank=0, first_step=0, last_step=50, first_time=T0 + 2,
                 step_time_sum_s=25.0, intervals=50),
              ev(30, "fault_injected", 0, step=55, fault="kill"), ev(31, "worker_died", 0),
              ev(32, "restart", 0), ev(38, "attempt_started", 1), ev(38.5, "restored", 1, step=9),
              ev(40, "steps", 1, rank=0, first_step=10, last_step=10, first_time=T0 + 40,
                 step_time_sum_s=0.0, intervals=0),
              ev(48, "checkpoint_committed", 1, step=19, seconds=1.0, blocked_s=1.0),
              ev(55, "fault_injected", 1, step=40, fault="kill"), ev(56, "worker_died", 1),
              ev(57, "restart", 1), ev(60, "attempt_started", 2),
              ev(61, "steps", 2, rank=0, first_step=20, last_step=60, first_time=T0 + 61,
                 step_time_sum_s=20.0, intervals=40), ev(90, "finished")]
    g = goodput(events)
    second = g.attempts[1]
    assert second.step_time_s == pytest.approx((55 - 40 - 1.0) / 30)
    # attempt 1 replays 10..40 of the 55 reached (31 steps) at that step time
    assert second.replayed_steps == 31
    # at most the attempt's window less its commit: all of it was replay, none new work
    assert second.badput_s["replay"] == pytest.approx(min(31 * (14 / 30), 15 - 1.0))
    assert second.productive_s == pytest.approx(0.0)
    assert not any("replayed steps' time" in n for n in g.not_measured)


def _hang(**stall: Any) -> list[dict[str, Any]]:
    return [ev(0, "start"), ev(1, "attempt_started", 0),
            ev(2, "steps", 0, rank=0, first_step=0, last_step=10, first_time=T0 + 2,
               step_time_sum_s=5.0, intervals=10),
            ev(20, "stall_detected", 0, step=10, timeout_s=5.0, **stall),
            ev(21, "worker_died", 0), ev(30, "failed")]


def test_a_stall_is_measured_from_the_last_progress_when_the_event_has_it():
    assert goodput(_hang()).badput_s["stall"] == pytest.approx(5.0)  # the timeout: a bound
    g = goodput(_hang(idle_s=5.3, last_progress_time=T0 + 14.5))
    assert g.badput_s["stall"] == pytest.approx(5.5)  # the record came 0.2 s after the check
    assert g.productive_s == pytest.approx(goodput(_hang()).productive_s - 0.5)


def _preempted(saved_step: int) -> list[dict[str, Any]]:
    return [ev(0, "start"), ev(1, "attempt_started", 0),
            ev(2, "steps", 0, rank=0, first_step=0, last_step=20, first_time=T0 + 2,
               step_time_sum_s=10.0, intervals=20),
            ev(30, "preemption_notice", 0, step=20),
            ev(32, "checkpoint_committed", 0, step=saved_step, seconds=1.0, blocked_s=1.0),
            ev(32, "preemption_checkpoint", 0, step=saved_step),
            ev(35, "worker_died", 0), ev(36, "restart", 0), ev(40, "attempt_started", 1),
            ev(41, "steps", 1, rank=0, first_step=saved_step + 1, last_step=saved_step + 1,
               first_time=T0 + 41, step_time_sum_s=0.0, intervals=0), ev(50, "finished")]


def test_the_steps_between_a_notice_and_its_later_checkpoint_are_work():
    same_step, later = goodput(_preempted(20)), goodput(_preempted(22))
    assert same_step.badput_s["preemption"] == pytest.approx(5.0)  # the notice to the death
    assert later.badput_s["preemption"] == pytest.approx(3.0)  # the checkpoint to the death
    assert later.productive_s == pytest.approx(same_step.productive_s + 2.0)


def test_a_restarts_last_step_counts_the_steps_a_raw_kill_left_unknown():
    def log(**restart: Any) -> list[dict[str, Any]]:
        return [ev(0, "start"), ev(1, "attempt_started", 0),
                ev(2, "steps", 0, rank=0, first_step=0, last_step=0, first_time=T0 + 2,
                   step_time_sum_s=0.0, intervals=0),
                ev(7, "steps", 0, rank=0, first_step=1, last_step=10, first_time=T0 + 2.5,
                   step_time_sum_s=5.0, intervals=10),
                ev(12, "worker_died", 0), ev(13, "restart", 0, **restart),
                ev(20, "attempt_started", 1), ev(20.5, "restored", 1, step=4),
                ev(30, "steps", 1, rank=0, first_step=5, last_step=30, first_time=T0 + 21,
                   step_time_sum_s=12.5, intervals=25), ev(40, "finished")]

    assert goodput(log()).replayed_steps == 6  # 5..10: what the summaries showed
    assert goodput(log(last_step=18, last_step_time=T0 + 11)).replayed_steps == 14  # 5..18
