"""A loop that reports rarer than it steps its optimizers (a Transformers Trainer reporting at
each save, every 10 optimizer steps) has its replay counted in optimizer steps: the lead rank
counts the ``optimizer.step()`` calls before each report, and those before its reports of
replayed steps. A loop that reports every step keeps its replay in its step unit."""

from __future__ import annotations

from typing import Any

import pytest

from rayguard.events import make_event
from rayguard.observe.compact_log import CompactLog
from rayguard.observe.goodput import goodput
from rayguard.observe.goodput_steps import (
    OPTIMIZER_UNIT,
    OptimizerCounts,
    replay_in_optimizer_steps,
)
from rayguard.observe.goodput_table import counted, format_goodput, headline
from rayguard.observe.steps import StepTimer

T0 = 1_700_000_000.0


def ev(t: float, kind: str, attempt: int | None = None, **fields: Any) -> dict[str, Any]:
    event = make_event(kind, kind, attempt=attempt, **fields)
    event["time"] = T0 + t
    return event


def trainer_killed(*, counted_steps: bool = True, per_report: int = 10,
                   replay_counted: bool = True) -> list[dict[str, Any]]:
    """A Trainer that reports and saves every ``per_report`` optimizer steps (its step is the
    global step: 10, 20, ...): checkpoint 10 committed, rank 1 killed at its step-20 report,
    the restart resumes from 10 and does optimizer steps 11-20 again before its step-20
    report. Without ``counted_steps``: a log from before the optimizer steps were counted."""
    def opt(n: int, replay: int = 0) -> dict[str, Any]:
        if not counted_steps:
            return {}
        return {"optimizer_steps": n, **({"replay_optimizer_steps": replay}
                                          if replay and replay_counted else {})}

    s = per_report
    return [ev(0, "start"), ev(1, "attempt_started", 0),
            ev(3, "steps", 0, rank=0, first_step=s, last_step=s, step=s, first_time=T0 + 3,
               step_time_sum_s=0.0, intervals=0, reports=1, **opt(s)),
            ev(4, "checkpoint_committed", 0, step=s, blocked_s=0.2, step_unit="step"),
            ev(6, "fault_injected", 0, rank=1, step=2 * s), ev(7, "worker_died", 0, rank=1),
            ev(8, "restart", 0), ev(10, "attempt_started", 1),
            ev(11, "restored", 1, step=s, step_unit="step"),
            ev(14, "steps", 1, rank=0, first_step=2 * s, last_step=2 * s, step=2 * s,
               first_time=T0 + 14, step_time_sum_s=0.0, intervals=0, reports=1,
               **opt(s, replay=s)),
            ev(20, "steps", 1, rank=0, first_step=3 * s, last_step=4 * s, step=4 * s,
               first_time=T0 + 17, step_time_sum_s=6.0, intervals=2, reports=2, **opt(2 * s)),
            ev(21, "finished")]


# -- the worker's count -------------------------------------------------------------------
class _Sent:
    """A step timer and the summaries it sends (the first report's at once, then the rest
    when taken), added up."""

    def __init__(self) -> None:
        self.timer = StepTimer(interval_s=1e9, clock=lambda: 0.0, wall=lambda: 0.0)
        self.summaries: list[dict[str, Any]] = []

    def report(self, step: int, optimizer_steps: int) -> None:
        for _ in range(optimizer_steps):
            self.timer.optimizer_stepped()
        summary = self.timer.on_report(step, {}, 0.0)
        if summary is not None:
            self.summaries.append(summary)

    def total(self, field: str) -> int:
        """``field`` over every summary sent, the one still due taken first."""
        last = self.timer.take()
        self.summaries += [last] if last is not None else []
        return sum(s.get(field, 0) for s in self.summaries)


def test_the_optimizer_steps_before_each_report_are_counted_and_those_of_replayed_reports():
    sent = _Sent()
    sent.timer.replaying(20)  # restored from 10; the run had reached 20
    for step in (20, 30, 40):
        sent.report(step, 10)
    assert sent.total("optimizer_steps") == 30 and sent.total("reports") == 3
    assert sent.total("replay_optimizer_steps") == 10  # the first report's, up to step 20


def test_a_loop_that_steps_no_optimizer_sends_no_count():
    sent = _Sent()
    sent.timer.replaying(5)
    for step in (3, 4, 5, 6):
        sent.report(step, 0)
    sent.total("reports")
    assert sent.summaries and not any(
        "optimizer_steps" in s or "replay_optimizer_steps" in s for s in sent.summaries)


def test_steps_of_a_rolled_back_attempt_are_not_counted_against_the_next_report():
    sent = _Sent()
    sent.report(0, 1)
    sent.timer.optimizer_stepped()  # stepped, then rolled back in place before its report
    sent.timer.end_attempt()
    sent.summaries.clear()
    sent.report(1, 1)
    assert sent.total("optimizer_steps") == 1


# -- the planner's decision ---------------------------------------------------------------
def test_a_trainer_reporting_every_10_optimizer_steps_replays_10_optimizer_steps():
    g = goodput(trainer_killed())
    assert (g.replayed_steps, g.replay_unit, g.step_unit) == (10, OPTIMIZER_UNIT, "step")
    assert [a.replayed_steps for a in g.attempts] == [0, 10]
    assert "10 optimizer steps replayed" in headline(g)
    assert "10 optimizer steps replayed" in format_goodput(g)
    assert g.to_dict()["replay_unit"] == OPTIMIZER_UNIT  # --goodput --json and the report
    assert counted(1, OPTIMIZER_UNIT) == "1 optimizer step"


def test_the_replay_s_cost_stays_the_reports_time():
    """Only the count changes unit: the time of the replay is the one replayed report's."""
    counted_log, plain_log = goodput(trainer_killed()), goodput(trainer_killed(counted_steps=False))
    assert counted_log.badput_s["replay"] == pytest.approx(plain_log.badput_s["replay"])
    assert counted_log.badput_s["replay"] > 0


def test_a_log_without_the_count_reads_as_before():
    g = goodput(trainer_killed(counted_steps=False))
    assert (g.replayed_steps, g.replay_unit) == (1, "step")
    assert "1 step replayed" in headline(g)


def test_a_loop_that_reports_every_optimizer_step_is_unchanged():
    g = goodput(trainer_killed(per_report=1))
    assert (g.replayed_steps, g.replay_unit) == (1, "step")
    assert "1 step replayed" in headline(g)


def test_an_uncounted_replay_is_estimated_at_the_run_s_steps_per_report_and_said_so():
    g = goodput(trainer_killed(replay_counted=False))
    assert (g.replayed_steps, g.replay_unit) == (10, OPTIMIZER_UNIT)
    assert any("attempt 1: its replayed optimizer steps" in n for n in g.not_measured)
    assert not any("optimizer" in n for n in goodput(trainer_killed()).not_measured)


def test_the_compact_log_keeps_the_optimizer_counts():
    log = CompactLog()  # what ``rayguard events --goodput`` and the live meter fold into
    for e in trainer_killed():
        log.add(e)
    g = goodput(log.events())
    assert (g.replayed_steps, g.replay_unit) == (10, OPTIMIZER_UNIT)


@pytest.mark.parametrize(("attempts", "expected"), [
    # every report one optimizer step: the step unit stays
    ([OptimizerCounts(5, 5, 0, 0), OptimizerCounts(5, 5, 2, 2)], None),
    # gradient accumulation over reports (fewer optimizer steps than reports)
    ([OptimizerCounts(8, 2, 0, 0), OptimizerCounts(8, 2, 1, 4)], None),
    ([OptimizerCounts(5, 0, 0, 0), OptimizerCounts(5, 0, 0, 2)], None),  # no torch optimizer
    ([OptimizerCounts(0, 0, 0, 0)], None),  # no report at all
    # rarer reports: the counts as measured, none estimated
    ([OptimizerCounts(2, 20, 0, 0), OptimizerCounts(4, 40, 10, 1)], ([0, 10], [])),
    # a replay the planner sees and no count: estimated at 10 per report
    ([OptimizerCounts(2, 20, 0, 0), OptimizerCounts(4, 40, 0, 2)], ([0, 20], [1])),
])
def test_the_replay_is_in_optimizer_steps_only_when_reports_are_rarer(attempts, expected):
    assert replay_in_optimizer_steps(attempts) == expected


def _report_data(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``rayguard report`` builds of a run's events, the goodput beside the timeline."""
    from rayguard.observe.report_goodput import replay_in_optimizer_steps
    from rayguard.observe.timeline import build_run

    data = build_run(events)
    data["goodput"] = goodput(events).to_dict()
    replay_in_optimizer_steps(data)
    return data


def test_the_report_s_timeline_counts_the_same_optimizer_steps():
    from rayguard.observe.report import _restart_table, summary_rows
    from rayguard.observe.timeline import build_run

    events = trainer_killed()
    plain = build_run(events)["summary"]
    data = _report_data(events)
    assert [r["replayed_steps"] for r in data["restarts"]] == [10]
    assert "replayed optimizer steps" in _restart_table(data)
    s = data["summary"]
    assert "10 optimizer steps replayed" in dict(summary_rows(s, OPTIMIZER_UNIT))[
        "time lost to failures"]
    # the time lost is the same: the replayed report's time over its 10 optimizer steps
    assert s["time_lost_s"] == plain["time_lost_s"]
    assert s["replayed_steps"] * s["mean_step_s"] == pytest.approx(
        plain["replayed_steps"] * plain["mean_step_s"])


def test_the_report_of_a_loop_reporting_every_step_is_unchanged():
    from rayguard.observe.timeline import build_run

    events = trainer_killed(per_report=1)
    data = _report_data(events)
    assert data["restarts"] == build_run(events)["restarts"]
    assert data["summary"] == build_run(events)["summary"]
