"""Metrics-only reports make no call to the run coordinator (the ranks agree through a gloo
all-reduce); a report with a state still runs the coordinator's gather; a rank that raises
before a report does not leave its peer waiting in the all-reduce. One fit proves all three
(these were two fits)."""

from __future__ import annotations

import json

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
    if rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"metrics_only_gathers": metrics_only, "state_gathers": with_state}, f)
    # then rank 1 fails before its next report: rank 0, in that report's all-reduce, is not
    # left waiting, and the attempt ends (no restart allowed)
    if rank == 1:
        import os
        import time

        deadline = time.monotonic() + 60  # rank 0 has read the coordinator's counts
        while not os.path.exists(config["out"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("rank 1 fails before its report")
    rayguard.train.report({"loss": 1.0, "step": 52})


def _trainer(fn, tmp_path, name, restarts, config):
    return rayguard.RobustTrainer(
        fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name=name),
        guard_config=rayguard.GuardConfig(numa="off",
                                          health=rayguard.HealthConfig(max_restarts=restarts)))


def test_metrics_only_reports_make_no_coordinator_call_and_a_failing_rank_ends_the_attempt(
        ray_local, tmp_path):
    out = tmp_path / "gathers.json"
    trainer = _trainer(count_loop, tmp_path, "count", restarts=0, config={"out": str(out)})
    with pytest.raises(WorkerGroupError) as info:
        trainer.fit()
    assert "rank 1 fails before its report" in str(info.value)
    gathers = json.loads(out.read_text())
    assert gathers["metrics_only_gathers"] == 0, gathers
    assert gathers["state_gathers"] >= 2, gathers  # the intent gather still runs, both ranks
