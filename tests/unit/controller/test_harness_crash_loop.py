"""Crash loops and errors a restart cannot fix, decided by rayguard's failure policy inside
Ray Train's real controller (rayguard.testing.controller), in milliseconds.

Proves the decisions of tests/ray/test_crash_loop.py (each test names its twin). Not covered
here, still only there: the user's exception and its worker traceback as the cause of what
``fit()`` raises (RobustTrainer._final_error over a real WorkerGroupError from real
processes), a real ``report(state=...)`` failing to pickle, and the caller's RunConfig left
unchanged (test_the_callers_run_config_is_not_changed, a plain unit test already).
"""

from __future__ import annotations

import pytest
from ray.train import FailureConfig
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard
from rayguard.controller.failure_policy import STOP_REASON_KEY
from rayguard.exceptions import StateNotCheckpointableError
from rayguard.run.facts import loaded_key


def bug(w):
    if w.step < 1:
        w.report(loss=1.0)
    else:
        raise ValueError("my bug")


def attempts(h):
    return [e["attempt"] for e in h.events("attempt_started")]


def guard(**health):
    return rayguard.GuardConfig(numa="off", preflight=False,
                                health=rayguard.HealthConfig(**health))


def test_a_deterministic_bug_ends_after_one_repeat(harness):
    # tests/ray/test_crash_loop.py::test_a_transient_error_recovers_and_a_deterministic_bug_then_ends_after_one_repeat
    h = harness(bug, num_workers=2, guard=guard()).run()
    assert h.state == "ERRORED" and attempts(h) == [0, 1]  # one retry of Ray's 3
    assert isinstance(h.error, WorkerGroupError)
    assert {r: str(e) for r, e in h.error.worker_failures.items()} == {0: "my bug", 1: "my bug"}
    kinds = h.kinds()
    assert kinds.count("crash_loop") == 1 and kinds.count("restart") == 1
    died = h.events("worker_died")
    assert len(died) == 4 and all(e["failure"] == "error" and "my bug" in e["details"]
                                  for e in died)
    stop = h.coordinator.get(STOP_REASON_KEY)
    assert stop["kind"] == "crash_loop" and "crash_loop_retries=1" in stop["reason"]
    assert "ValueError: my bug" in stop["reason"] and "test_harness_crash_loop.py" in stop["reason"]
    assert "no checkpoint committed in between" in stop["reason"]


def test_zero_crash_loop_retries_stops_at_the_first_exception(harness):
    # tests/ray/test_crash_loop.py::test_zero_crash_loop_retries_stops_at_the_first_exception
    h = harness(bug, guard=guard(crash_loop_retries=0)).run()
    assert h.state == "ERRORED" and attempts(h) == [0] and "restart" not in h.kinds()


def test_two_retries_allow_two_repeats(harness):
    h = harness(bug, guard=guard(crash_loop_retries=2),
                failure_config=FailureConfig(max_failures=5)).run()
    assert h.state == "ERRORED" and attempts(h) == [0, 1, 2]
    assert "allows 2 repeats" in h.events("crash_loop")[0]["detail"]


def test_an_unsaveable_state_is_never_retried(harness):
    # tests/ray/test_crash_loop.py::test_an_unsaveable_state_is_never_retried_and_keeps_its_fix
    def unsaveable(w):
        raise StateNotCheckpointableError("state['cfg'] cannot be checkpointed. Fix: ...")

    h = harness(unsaveable, num_workers=1).run()
    assert h.state == "ERRORED" and attempts(h) == [0]
    (stop,) = h.events("not_retried")
    assert "StateNotCheckpointableError is not retried" in stop["detail"]
    assert h.coordinator.get(STOP_REASON_KEY)["kind"] == "fatal"


def test_a_transient_error_still_recovers(harness):
    # tests/ray/test_crash_loop.py::test_a_transient_error_recovers_and_a_deterministic_bug_then_ends_after_one_repeat (attempt 0)
    def transient(w):
        if w.attempt == 0 and w.step == 2:
            raise ConnectionError("flaky storage")
        if w.step >= 3:
            return w.finish()
        w.report(loss=1.0)
        if w.rank == 0:
            w.commit()

    h = harness(transient, num_workers=1).run()
    assert h.state == "FINISHED" and h.error is None and attempts(h) == [0, 1]
    assert "crash_loop" not in h.kinds()
    assert h.groups[1].pids != h.groups[0].pids  # a new process, resumed from step 2
    assert h.coordinator.get_progress()["step"] == 3


def test_a_failure_that_repeats_at_the_same_step_stops_after_one_repeat(harness):
    # tests/ray/test_crash_loop.py::test_a_failure_that_repeats_at_the_same_step_stops_after_one_repeat
    def raise_at_end(w):  # a checkpoint at every step, then the same error at the same step
        if w.step < 2:
            w.report(loss=1.0)
            w.commit()
        else:
            raise RuntimeError("always at the end")

    h = harness(raise_at_end, num_workers=1).run()
    assert h.state == "ERRORED" and attempts(h) == [0, 1]
    detail = h.events("crash_loop")[0]["detail"]
    assert "always at the end" in detail and "no checkpoint committed in between" in detail


def test_a_repeat_at_the_same_step_after_a_commit_says_so(harness):
    def commit_then_raise(w):  # every attempt commits the step it resumed at, then raises
        if w.step < 2:
            w.report(loss=1.0)
        w.commit()
        raise RuntimeError("always at step 2")

    h = harness(commit_then_raise, num_workers=1).run()
    assert h.state == "ERRORED"
    detail = h.events("crash_loop")[0]["detail"]
    assert "no checkpoint committed" not in detail
    assert "at the same step (2) although it committed a checkpoint in between" in detail, detail


def test_progress_between_two_identical_errors_is_not_a_loop(harness):
    # the same error from the same frame, but each attempt commits and fails further on
    def later_each_time(w):
        if w.step < 2 * (w.attempt + 1):
            w.report(loss=1.0)
            w.commit()
        else:
            raise RuntimeError("late")

    h = harness(later_each_time, num_workers=1,
                failure_config=FailureConfig(max_failures=2)).run()
    assert h.state == "ERRORED" and attempts(h) == [0, 1, 2]  # Ray's own budget ended it
    assert "crash_loop" not in h.kinds()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_dies_is_never_a_crash_loop(harness, workers):
    def dies(w):
        if w.step < 1:
            w.report(loss=1.0)
        else:
            w.die("SIGKILL")

    h = harness(dies, num_workers=workers, failure_config=FailureConfig(max_failures=2)).run()
    assert h.state == "ERRORED" and attempts(h) == [0, 1, 2]
    assert "crash_loop" not in h.kinds()
    died = h.events("worker_died")
    assert {e["failure"] for e in died} == {"kill"}
    assert all("worker process died" in e["detail"] for e in died)


def unloadable(fresh: bool):
    """Checkpoints at steps 1 and 3 (rank 0), rank 1 killed at step 4 in attempt 0; every
    resume then reads the newest checkpoint not rejected and names it, as
    ``ray.train.get_checkpoint()`` and ``load_state()`` do (rank 0), and fails on step 3's (a
    format the loop no longer reads). ``fresh``: the loop reads none (starts over) and fails
    at the same place."""
    def loop(w):
        if w.ticks == 1 and w.attempt > 0:  # this process's resume
            rejected = w.coordinator.rejected_checkpoints()
            path = None if fresh else next(p for p in ("checkpoint_000003", "checkpoint_000001")
                                           if p not in rejected)
            if w.rank == 0:
                w.link.put(loaded_key(w.attempt), path)
            if path in (None, "checkpoint_000003"):
                raise ValueError("unknown checkpoint format")
            w.step = 1
        if w.step >= 5:
            return w.finish()
        if w.attempt == 0 and w.step == 4 and w.rank == 1:
            return w.die("SIGKILL")
        w.report(loss=1.0)
        if w.rank == 0 and w.step in (1, 3):
            w.commit(f"checkpoint_{w.step:06d}")
    return loop


def run_unloadable(harness, *, fresh: bool):
    """:func:`unloadable` under the whole-group restart, with room for three restarts."""
    return harness(unloadable(fresh), guard=rayguard.GuardConfig(
        numa="off", preflight=False, recovery="restart"),
        failure_config=FailureConfig(max_failures=3)).run()


def test_the_checkpoint_a_repeat_could_not_load_is_rejected_and_the_next_resumes_older(harness):
    # tests/ray/test_ray_report_loops.py::test_a_verified_checkpoint_the_loop_cannot_load_is_rejected_after_the_repeat
    # (ray.train.get_checkpoint()); the same decision for load_state(), whose end-to-end fit
    # this replaced: that it names the checkpoint it reads and skips a rejected one is
    # tests/unit/train/test_protocol.py::test_a_checkpoint_the_crash_loop_rule_rejected_is_skipped_and_the_one_read_named
    h = run_unloadable(harness, fresh=False)
    assert h.state == "FINISHED" and h.error is None, h.error
    assert attempts(h) == [0, 1, 2, 3]  # the kill; the first failed load; its repeat; older
    (rejected,) = h.events("checkpoint_rejected")
    assert rejected["path"] == "checkpoint_000003" and rejected["attempt"] == 2, rejected
    assert "attempts 1-2 resumed from it" in rejected["detail"]
    assert "cannot load it" in rejected["detail"]
    assert list(h.coordinator.rejected_checkpoints()) == ["checkpoint_000003"]
    assert "crash_loop" not in h.kinds()
    assert h.coordinator.get_progress()["step"] == 5  # resumed from step 1's, ran to the end


def test_a_repeat_that_loaded_no_checkpoint_is_a_crash_loop(harness):
    # nothing to reject (the attempts started fresh): the crash-loop rule ends the run
    h = run_unloadable(harness, fresh=True)
    assert h.state == "ERRORED" and attempts(h) == [0, 1, 2]
    assert not h.events("checkpoint_rejected") and h.kinds().count("crash_loop") == 1
