"""Errors a restart cannot fix end the run at once (or after one repeat), with the user's
own exception, its worker traceback and rayguard's whole message; a transient error before
them still recovers (the same run: a different error is not a repeat). Real RobustTrainer
runs on the shared local cluster."""

from __future__ import annotations

import pytest
from ray.train import FailureConfig, RunConfig
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard
from rayguard.events import read as read_events
from rayguard.exceptions import StateNotCheckpointableError, WorkerTraceback
from rayguard.testing.recorder import make_trainer


def bug_loop(config):
    raise ValueError("my bug")


def transient_then_bug_loop(config):
    """Attempt 0 fails at step 2 with a transient error; every later attempt resumes and
    fails at step 3 with the same bug (attempt 1 after committing step 2: the checkpoint it
    resumed from loads fine)."""
    ctx = rayguard.train.get_context()
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    for step in range(start, 4):
        if ctx.attempt == 0 and step == 2:
            raise ConnectionError("flaky storage")
        if ctx.attempt > 0 and step == 3:
            raise ValueError("my bug")
        rayguard.train.report({"loss": 1.0, "step": step},
                              state={"step": step} if ctx.rank == 0 else None)


def unsaveable_loop(config):
    class SomeObject:
        pass

    rayguard.train.report({"loss": 1.0}, state={"cfg": SomeObject()})


def _attempts(events):
    """The attempts that ran: started, or ended by a worker's failure (rank 0 records the
    start; a rank 1 that fails first can end the run before it does)."""
    return sorted({e["attempt"] for e in events
                   if e["kind"] in ("attempt_started", "worker_died")})


def _fit_error(tmp_path, fn, name, num_workers=1, **guard):
    trainer = make_trainer(fn, tmp_path, num_workers=num_workers,
                           guard=rayguard.GuardConfig(numa="off", **guard), name=name)
    with pytest.raises(WorkerGroupError) as info:
        trainer.fit()
    return info.value, read_events(trainer.run_dir)


def test_a_transient_error_recovers_and_a_deterministic_bug_then_ends_after_one_repeat(
        ray_local, tmp_path):
    error, events = _fit_error(tmp_path, transient_then_bug_loop, "bug", num_workers=2)
    # attempt 0's transient error is recovered from (attempt 1 resumes after its checkpoint);
    # the bug then gets one retry at most (was 4 attempts)
    assert _attempts(events) == [0, 1, 2]
    causes = [(e["attempt"], e["cause"]) for e in events if e["kind"] == "restart"]
    assert causes == [(0, "error"), (1, "error")], causes
    restored = [(e["attempt"], e["step"]) for e in events if e["kind"] == "restored"]
    assert (1, 1) in restored, restored
    assert "flaky storage" in next(e["details"] for e in events if e["kind"] == "worker_died")
    text = str(error)
    assert "ValueError: my bug" in text and "crash loop" in text and "crash_loop_retries" in text
    assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == "my bug"
    worker_tb = error.__cause__.__cause__
    assert isinstance(worker_tb, WorkerTraceback)
    assert "test_crash_loop.py" in str(worker_tb) and "bug_loop" in str(worker_tb)
    kinds = [e["kind"] for e in events]
    assert "crash_loop" in kinds and kinds[-1] == "failed"
    died = [e for e in events if e["kind"] == "worker_died"]
    assert died and all("\n" not in e["detail"] and e["failure"] == "error" for e in died)
    assert all("my bug" in e["details"] for e in died if e["attempt"] > 0)


def test_an_unsaveable_state_is_never_retried_and_keeps_its_fix(ray_local, tmp_path):
    error, events = _fit_error(tmp_path, unsaveable_loop, "unsaveable")
    assert _attempts(events) == [0]
    text = str(error)
    assert "state['cfg']" in text and "state['state']" not in text
    assert "Fix:" in text and "Output truncated" not in text
    assert isinstance(error.__cause__, StateNotCheckpointableError)
    assert "not_retried" in [e["kind"] for e in events]


def test_the_callers_run_config_is_not_changed(tmp_path):
    rc = RunConfig(storage_path=str(tmp_path))
    trainer = rayguard.RobustTrainer(bug_loop, run_config=rc)
    assert rc.failure_config == FailureConfig()  # the caller's object is untouched
    assert trainer.run_config.failure_config.max_failures == 3
    none = rayguard.RobustTrainer(bug_loop, run_config=rc, guard_config=rayguard.GuardConfig(
        health=rayguard.HealthConfig(max_restarts=0)))
    assert none.run_config.failure_config.max_failures == 0
