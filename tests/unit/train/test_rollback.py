"""The in-place NaN rollback's pure parts: the budget rule, the control-flow exception, and
the session's report raising it on every rank once the agreement carries the flag."""

from __future__ import annotations

import pickle

import pytest

from rayguard.train.agreement import Flags, merge_all
from rayguard.train.rollback import RollBack, plan_rollback


@pytest.mark.parametrize("done, budget, ok", [(0, 3, True), (2, 3, True), (3, 3, False),
                                              (0, 0, False), (50, -1, True)])
def test_the_restart_budget_bounds_rollbacks(done, budget, ok):
    decision = plan_rollback(done, budget, step=done)
    assert decision.ok is ok and decision.count == done + 1
    if not ok:
        assert f"max_failures={budget}" in decision.reason and f"{done} in-place" in decision.reason


def test_a_nan_that_comes_back_at_the_same_step_is_a_crash_loop():
    first = plan_rollback(0, -1, step=7)
    again = plan_rollback(1, -1, step=7, last_step=7, repeats=first.repeats)
    assert first.ok and again.ok and again.repeats == 1  # one repeat allowed by default
    third = plan_rollback(2, -1, step=7, last_step=7, repeats=again.repeats)
    assert not third.ok and "crash loop" in third.reason and "crash_loop_retries=1" in third.reason
    assert plan_rollback(2, -1, step=9, last_step=7, repeats=1).ok  # progress: a new step
    assert not plan_rollback(0, -1, step=7, last_step=7, crash_loop_retries=0).ok


def test_rollback_is_not_an_exception_a_loop_would_swallow():
    assert not issubclass(RollBack, Exception)
    try:
        try:
            raise RollBack(4)
        except Exception:  # a loop's own handler  # pragma: no cover - must not catch it
            pytest.fail("RollBack was caught as an Exception")
    except RollBack as rb:
        assert rb.step == 4
    assert pickle.loads(pickle.dumps(RollBack(3))).args == (3,)


def test_one_ranks_nan_reaches_every_rank():
    assert merge_all([Flags(), Flags(nonfinite=True)]).nonfinite
    assert not merge_all([Flags(state=True), Flags()]).nonfinite


class _Link:
    class ctx:  # noqa: N801 - the link's context, as a namespace
        rank, node_id = 0, "n0"

    def __init__(self):
        self.events = []

    def record(self, kind, detail, **extra):
        self.events.append((kind, extra))


@pytest.mark.parametrize("policy, defer, outcome", [
    ("restart", True, "deferred"), ("restart", False, "raise"), ("fail", True, "raise")])
def test_a_deferred_nan_is_recorded_and_returned_not_raised(policy, defer, outcome):
    from rayguard.exceptions import NonFiniteMetricError
    from rayguard.health.config import HealthConfig
    from rayguard.health.finite import FiniteGuard

    link, flushed = _Link(), []
    guard = FiniteGuard(HealthConfig(nan_policy=policy), link, lambda: flushed.append(1))
    assert guard.check({"loss": 1.0}, 3, defer=defer) is False
    if outcome == "deferred":
        assert guard.check({"loss": float("nan")}, 4, defer=defer) is True
        assert not flushed
    else:
        with pytest.raises(NonFiniteMetricError):
            guard.check({"loss": float("nan")}, 4, defer=defer)
    kind, extra = link.events[-1]
    assert kind == "nan_detected" and extra["step"] == 4
    assert extra["path"] == ("in_place" if outcome == "deferred" else "restart")


@pytest.mark.parametrize("budget, rolls_back", [(-1, True), (0, False)])
def test_an_in_place_rollback_opens_its_attempt_at_the_runs_owner(tmp_path, monkeypatch,
                                                                  budget, rolls_back):
    import json
    from types import SimpleNamespace

    import ray
    import torch

    from rayguard.config import GuardConfig
    from rayguard.exceptions import FatalNonFiniteMetricError
    from rayguard.health.recovery import ROLLBACK
    from rayguard.run.coordinator import RunCoordinator
    from rayguard.run.link import RunLink
    from rayguard.testing.coordinator import InProcessCoordinator
    from rayguard.train.context import GuardContext
    from rayguard.train.rollback import re_enter

    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    coordinator = InProcessCoordinator(RunCoordinator(str(tmp_path / "events.jsonl"),
                                                      {"run": "t", "metrics": None}))
    coordinator.open_attempt("restart")
    ctx = GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       node_id="n0", device=torch.device("cpu"), seed=None, attempt=0,
                       run_dir=str(tmp_path))
    rolled: list = []
    session = SimpleNamespace(
        link=RunLink(ctx, coordinator), ctx=ctx, guard=GuardConfig(), report_count=3,
        checkpointer=SimpleNamespace(pending_commit=lambda: None),
        forwarding=SimpleNamespace(last_path="/r/ckpt4"), end_attempt_steps=lambda: None,
        injector=SimpleNamespace(attempt=0))
    bridge = SimpleNamespace(count=0, latest_reported=lambda: None,
                             rolled_back=lambda path, reported: rolled.append(path))
    try:
        if not rolls_back:
            with pytest.raises(FatalNonFiniteMetricError, match="max_failures=0"):
                re_enter(session, bridge, RollBack(7), max_failures=budget)
            assert coordinator.latest_attempt().number == 0 and ctx.attempt == 0
            return
        re_enter(session, bridge, RollBack(7), max_failures=budget)
    finally:
        coordinator.stop()
    opened = coordinator.target.latest_attempt()
    assert (opened.number, opened.kind) == (1, ROLLBACK)
    assert ctx.attempt == session.injector.attempt == 1 and rolled == ["/r/ckpt4"]
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    restart, started = (json.loads(line) for line in lines)
    assert (restart["kind"], restart["attempt"], restart["path"]) == ("restart", 0, "in_place")
    assert restart["detail"] == ("NaN/inf at step 7: every rank re-enters the training "
                                 "function in its own process (attempt 1)")
    assert (started["kind"], started["attempt"], started["path"]) == (
        "attempt_started", 1, "in_place")
    assert started["group_start_time"] == opened.opened_at
