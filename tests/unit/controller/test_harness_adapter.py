"""The harness itself: what it drives is Ray's own controller and RobustTrainer's own wiring,
its one door to Ray's internals fails with a clear message when they move, and a scripted run
that does not end says where it stopped."""

from __future__ import annotations

import importlib

import pytest

import rayguard._ray.harness as adapter
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.controller.failure_policy import GuardFailurePolicy
from rayguard.controller.fence import FencedFixedPolicy
from rayguard.controller.rank_order import RankOrder
from rayguard.exceptions import RayVersionError
from rayguard.testing.controller import HarnessError, steady


def test_the_controller_is_rays_and_the_wiring_is_robust_trainers(harness):
    from ray.train.v2._internal.execution.controller import TrainController

    h = harness(steady(3))
    assert isinstance(h.controller, TrainController)
    assert isinstance(h.failure_policy, GuardFailurePolicy)
    assert isinstance(h.scaling_policy, FencedFixedPolicy)  # quarantine_after=2 by default
    assert [type(c) for c in h.callbacks] == [RayGuardCallback, RankOrder]
    h.run()
    assert h.state == "FINISHED" and h.error is None


def test_a_run_that_does_not_end_says_where_it_stopped(harness):
    h = harness(lambda w: w.report(loss=1.0))
    with pytest.raises(HarnessError, match="still RUNNING after 20 steps"):
        h.run(max_steps=20)


def test_a_step_after_the_end_is_refused(harness):
    h = harness(steady(2)).run()
    with pytest.raises(HarnessError, match="already ended"):
        h.step()


def test_ray_internals_that_moved_are_named(monkeypatch):
    from ray.train.v2._internal.execution.controller import TrainController

    monkeypatch.delattr(TrainController, "_run_control_loop_iteration")
    try:
        with pytest.raises(RayVersionError, match=r"TrainController\._run_control_loop_iteration"):
            importlib.reload(adapter)
    finally:
        monkeypatch.undo()
        importlib.reload(adapter)
