"""Metrics-only reports make no call to the run coordinator (the ranks agree through a gloo
all-reduce); a report with a state still runs the coordinator's gather; a rank that raises
before a report does not leave its peer waiting in the all-reduce."""

from __future__ import annotations

import pytest
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard


def count_loop(config):
    import ray

    from rayguard.train.setup import current_session

    coordinator = current_session().link.actor

    def contributions() -> int:
        """Ranks' contributions the coordinator's gathers received, read off the actor
        with Ray's ``__ray_call__`` (the actor has no test-only method for it)."""
        return ray.get(coordinator.__ray_call__.remote(lambda actor: actor._gathers.calls))

    rank = rayguard.train.get_context().rank
    rayguard.train.report({"loss": 1.0, "step": 0})  # the first one gathers preflight facts
    before = contributions()
    for step in range(1, 51):
        rayguard.train.report({"loss": 1.0, "step": step})
    metrics_only = contributions() - before
    rayguard.train.report({"loss": 1.0, "step": 51}, state={"step": 51} if rank == 0 else None)
    with_state = contributions() - before - metrics_only
    rayguard.train.report({"loss": 1.0, "step": 52, "metrics_only_gathers": metrics_only,
                           "state_gathers": with_state},  # Result.metrics: the checkpoint's
                          state={"step": 52} if rank == 0 else None)


def _trainer(fn, tmp_path, name, restarts=3):
    return rayguard.RobustTrainer(
        fn, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name=name),
        guard_config=rayguard.GuardConfig(numa="off",
                                          health=rayguard.HealthConfig(max_restarts=restarts)))


def test_metrics_only_reports_make_no_coordinator_call(ray_local, tmp_path):
    result = _trainer(count_loop, tmp_path, "count").fit()
    assert result.metrics["metrics_only_gathers"] == 0
    assert result.metrics["state_gathers"] >= 2  # the intent gather still runs, both ranks


def raise_before_report_loop(config):
    rank = rayguard.train.get_context().rank
    for step in range(10):
        if rank == 1 and step == 3:
            raise RuntimeError("rank 1 fails before its report")
        rayguard.train.report({"loss": 1.0, "step": step})


def test_a_rank_failing_before_the_all_reduce_ends_the_attempt(ray_local, tmp_path):
    with pytest.raises(WorkerGroupError) as info:
        _trainer(raise_before_report_loop, tmp_path, "mismatch", restarts=0).fit()
    assert "rank 1 fails before its report" in str(info.value)
