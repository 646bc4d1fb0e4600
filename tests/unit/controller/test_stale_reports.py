"""A failed attempt's report that reaches the controller after live recovery began is dropped
before Ray's report handler pairs it (rayguard._ray.stale_reports). Ray's own report handler,
poll statuses and training reports; the scenario of the whole-suite run under live: a
survivor's report of the failed attempt queued after Ray cleared its result queue, then
paired with the replacement's first report, and every later result one report behind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ray.train.v2._internal.execution.callback import ReportCallback
from ray.train.v2._internal.execution.checkpoint.report_handler import ReportCallbackHandler
from ray.train.v2._internal.execution.training_report import _TrainingReport
from ray.train.v2._internal.execution.worker_group import WorkerGroupPollStatus, WorkerStatus

import rayguard._ray.resize as ray_resize
from rayguard._ray.report import ATTEMPT_TAG, AttemptTagged, untagged
from rayguard._ray.resize import GuardController
from rayguard._ray.stale_reports import StaleReports, drop_stale
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.health.recovery import LIVE
from rayguard.run.attempts import Attempt


class Results(ReportCallback):
    """What Ray's checkpoint manager would record: each consolidated report's metrics."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self.metrics.append(dict(training_report.metrics))


class Group:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def report(step: int, attempt: int | None) -> _TrainingReport:
    metrics: dict[str, Any] = {"step": step}
    if attempt is not None:
        metrics[ATTEMPT_TAG] = attempt
    return _TrainingReport(checkpoint=None, metrics=metrics, validation=False)


def poll(*reports: _TrainingReport | None) -> WorkerGroupPollStatus:
    return WorkerGroupPollStatus(worker_statuses={
        rank: WorkerStatus(running=True, training_report=r) for rank, r in enumerate(reports)})


def live_run(filtered: bool) -> list[dict[str, Any]]:
    """Two ranks: attempt 1 reports step 1, rank 1 dies while rank 0 reports step 2, Ray
    replaces rank 1 (its handler's queues reset) and live attempt 2 resumes from step 1;
    rank 0's report of step 2 in attempt 1, released by the replacement, arrives first."""
    results, floor = Results(), [-1]
    handler = ReportCallbackHandler([results])
    callbacks: list[Any] = [handler]
    if filtered:
        callbacks.insert(0, StaleReports(lambda: floor[0]))

    def polled(status: WorkerGroupPollStatus) -> None:
        for cb in callbacks:
            cb.after_worker_group_poll_status(status)

    handler.after_worker_group_start(Group(2))
    polled(poll(report(1, 1), report(1, 1)))
    floor[0] = 2  # the live attempt opens (the failure decision), before the replacement
    handler.after_replica_group_start(None)
    polled(poll(report(2, 1), None))  # the survivor's stale report
    polled(poll(report(2, 2), report(2, 2)))
    polled(poll(report(3, 2), report(3, 2)))
    return results.metrics


def test_the_stale_report_is_dropped_and_every_result_is_its_own_step():
    assert live_run(filtered=True) == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_without_the_filter_results_are_one_report_behind():  # the fault the filter fixes
    stale = live_run(filtered=False)
    assert [m["step"] for m in stale] == [1, 2, 2]
    assert stale[1][ATTEMPT_TAG] == 1  # rank 0's stale report became the consolidated one


def test_the_tag_comes_off_every_report_and_untagged_reports_pass():
    status = poll(report(5, 3), report(5, None), None, report(4, 2))
    assert drop_stale(status.worker_statuses, floor=3) == [3]
    statuses = status.worker_statuses
    assert statuses[0].training_report.metrics == {"step": 5}
    assert statuses[1].training_report.metrics == {"step": 5}
    assert statuses[2].training_report is None and statuses[3].training_report is None


def test_no_live_attempt_drops_nothing():
    status = poll(report(1, 0), report(1, 0))
    assert drop_stale(status.worker_statuses, floor=-1) == []
    assert [s.training_report.metrics for s in status.worker_statuses.values()] == [
        {"step": 1}, {"step": 1}]


def test_the_floor_is_the_live_attempt_the_group_runs():
    callback = RayGuardCallback(SimpleNamespace(), mode=LIVE)
    assert callback.report_floor == -1  # the group's own start
    callback._live = (Attempt(number=4, kind=LIVE), None, None)
    assert callback.report_floor == 4


class Inner:
    def __init__(self) -> None:
        self.reports: list[tuple[Any, ...]] = []
        self.other = "inner's"

    def report(self, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self.reports.append((metrics, args, kwargs))


def test_a_report_carries_the_attempt_it_is_made_in():
    inner, ctx = Inner(), SimpleNamespace(attempt=1)
    tagged = AttemptTagged(inner, lambda: ctx.attempt)
    mine = {"loss": 0.5}
    tagged.report(mine, "ckpt", checkpoint_dir_name="d")
    ctx.attempt = 2  # an in-place rollback moves the rank to a new attempt
    tagged.report({"loss": 0.4})
    assert inner.reports == [({"loss": 0.5, ATTEMPT_TAG: 1}, ("ckpt",),
                              {"checkpoint_dir_name": "d"}),
                             ({"loss": 0.4, ATTEMPT_TAG: 2}, (), {})]
    assert mine == {"loss": 0.5}  # the caller's dict is not changed
    assert tagged.other == "inner's" and untagged(tagged) is inner and untagged(inner) is inner
    assert AttemptTagged(tagged, lambda: 3).untagged is inner  # a rejoin never wraps twice


def test_the_guard_controller_puts_the_filter_before_rays_report_handler(monkeypatch):
    guard = RayGuardCallback(SimpleNamespace(), mode=LIVE)
    handler = object()

    def rays_init(self: Any, **kwargs: Any) -> None:  # what TrainController.__init__ sets
        self._callbacks = kwargs["callbacks"]
        self._worker_group_callbacks_to_propagate = [handler, *kwargs["callbacks"]]

    monkeypatch.setattr(ray_resize.TrainController, "__init__", rays_init)
    ctl = GuardController(callbacks=[guard])
    first, second, *_ = ctl._worker_group_callbacks_to_propagate
    assert isinstance(first, StaleReports) and second is handler
    guard._live = (Attempt(number=7, kind=LIVE), None, None)
    assert first.floor() == 7


@pytest.mark.parametrize("callbacks", [[], [object()]])
def test_without_rayguards_callback_nothing_is_inserted(monkeypatch, callbacks):
    def rays_init(self: Any, **kwargs: Any) -> None:
        self._callbacks = kwargs["callbacks"]
        self._worker_group_callbacks_to_propagate = ["handler"]

    monkeypatch.setattr(ray_resize.TrainController, "__init__", rays_init)
    assert GuardController(callbacks=callbacks)._worker_group_callbacks_to_propagate == [
        "handler"]
