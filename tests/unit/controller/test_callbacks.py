"""RayGuardCallback on Ray's own poll-status objects, with the run's real coordinator called
in process: attempts counted, each worker failure recorded once with its cause, a RETRY
recorded as a restart."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus

from rayguard._ray.train import FailureDecision, unwrap_worker_error
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.exceptions import NonFiniteMetricError
from rayguard.failures import classify
from rayguard.faults.spec import ENV_SOURCE, injected_mark


def status(errors: dict[int, BaseException | None]) -> WorkerGroupPollStatus:
    return WorkerGroupPollStatus(worker_statuses={
        rank: WorkerStatus(running=error is None, error=error) for rank, error in errors.items()})  # type: ignore[arg-type]


def test_attempts_are_counted_by_the_coordinator(coordinator) -> None:
    callback = RayGuardCallback(coordinator)
    callback.before_worker_group_start(None)
    callback.before_worker_group_start(None)
    assert callback._attempt == 1 and coordinator.target.attempt() == 1


def test_each_failure_is_recorded_once_per_attempt_with_its_cause(coordinator, events) -> None:
    callback = RayGuardCallback(coordinator)
    callback.before_worker_group_start(None)
    coordinator.target.put("cause:0:1", "injected kill at step 3")
    polled = status({0: None, 1: RuntimeError("killed"), 2: NonFiniteMetricError("loss is nan\nmore")})
    callback.after_worker_group_poll_status(polled)
    callback.after_worker_group_poll_status(polled)  # polled again: nothing new
    died = [e for e in events() if e["kind"] == "worker_died"]
    assert [(e["rank"], e["attempt"], e["failure"]) for e in died] == [
        (1, 0, "error"), (2, 0, "nan")]
    assert died[0]["detail"].startswith("rank 1 failed: injected kill at step 3")
    assert died[1]["detail"] == "rank 2 failed: NonFiniteMetricError: loss is nan"
    assert "more" in died[1]["details"]
    callback.before_worker_group_start(None)  # the same rank failing in a new attempt is new
    callback.after_worker_group_poll_status(status({1: RuntimeError("again")}))
    assert [(e["rank"], e["attempt"]) for e in events() if e["kind"] == "worker_died"][-1] == (1, 1)


def test_a_retry_is_recorded_as_a_restart_and_nothing_else_is(coordinator, events) -> None:
    callback = RayGuardCallback(coordinator)
    callback.before_worker_group_start(None)
    callback.before_controller_execute_failure_decision(FailureDecision.RAISE)
    callback.before_controller_execute_failure_decision(FailureDecision.NOOP)
    assert events() == []
    callback.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert [(e["kind"], e["attempt"]) for e in events()] == [("restart", 0)]


def test_an_unreadable_cause_is_described_from_the_error(coordinator, events) -> None:
    class NoGet:
        def __getattr__(self, name):
            if name == "get":
                raise TimeoutError("slow")
            return getattr(coordinator, name)

    callback = RayGuardCallback(NoGet())
    callback.before_worker_group_start(None)
    callback.after_worker_group_poll_status(status({0: ValueError("bad")}))
    assert [(e["failure"], e["detail"]) for e in events()] == [("error", "rank 0 failed: ValueError: bad")]


def describe_failure(error: BaseException, marked: str | None) -> tuple[str, str, str]:
    """``(label, reason, details)`` of a worker's failure as the callback records it: the
    failure taxonomy's verdict on the error inside Ray's wrapper."""
    failure = classify(unwrap_worker_error(error), marked)
    return failure.label, failure.reason, failure.details


def test_describe_failure_causes() -> None:
    assert describe_failure(ActorDiedError(), None)[0] == "died"
    assert describe_failure(UserExceptionWithTraceback(NonFiniteMetricError("x"), "tb"), None)[0] == "nan"
    cause, reason, _ = describe_failure(RuntimeError("x"), "killed by rayguard: stall")
    assert cause == "stall" and "stall_detected" in reason
    cause, reason, _ = describe_failure(RuntimeError("x"), "injected hang at step 2")
    assert cause == "injected hang at step 2" and "RAYGUARD_FAULTS" in reason


def test_worker_died_reason_is_one_line_with_its_cause():
    class WorkerHealthCheckFailedError(Exception):
        health_check_failure = None

    death = WorkerHealthCheckFailedError("Worker health check failed\nlong\nRay\ndump")
    cause, reason, details = describe_failure(death, injected_mark("kill", ENV_SOURCE))
    assert cause == "injected kill" and reason == "injected kill (RAYGUARD_FAULTS)"
    assert "\n" in details and "\n" not in reason
    cause, reason, _ = describe_failure(death, None)
    assert cause == "died" and "\n" not in reason and "Worker health check failed" in reason
    cause, reason, _ = describe_failure(death, "killed by rayguard: stall")
    assert cause == "stall" and "watchdog" not in reason and "stall_detected" in reason
    cause, reason, _ = describe_failure(ValueError("my bug\ntrace"), None)
    assert (cause, reason) == ("error", "ValueError: my bug")


def test_an_injected_nan_reads_as_a_nan_detection() -> None:
    # RAYGUARD_FAULTS=nan:... poisons a metric; the NaN guard is what stops the worker.
    error = UserExceptionWithTraceback(NonFiniteMetricError("loss is nan at step 4"), "tb")
    cause, reason, _ = describe_failure(error, injected_mark("nan", ENV_SOURCE))
    assert cause == "nan"
    assert reason.startswith("NonFiniteMetricError: loss is nan at step 4")
    assert reason.endswith("(the NaN was injected: RAYGUARD_FAULTS)")
    cause, reason, _ = describe_failure(error, None)  # a real NaN: no injection noted
    assert cause == "nan" and "injected" not in reason
    cause, _, _ = describe_failure(ActorDiedError(), "injected kill")  # other faults unchanged
    assert cause == "injected kill"


def test_worker_died_carries_the_classified_failure(coordinator, events) -> None:
    from rayguard.exceptions import ConfigError

    callback = RayGuardCallback(coordinator)
    callback.before_worker_group_start(None)
    coordinator.target.put("cause:0:1", "injected kill")
    callback.after_worker_group_poll_status(status({
        0: UserExceptionWithTraceback(ConfigError("bad value"), "tb"), 1: ActorDiedError(),
        2: ValueError("my bug")}))
    died = {e["rank"]: e for e in events() if e["kind"] == "worker_died"}
    fields = ("failure", "fatal", "retry", "error_type")
    assert tuple(died[0][k] for k in fields) == (
        "config", True, "not_retried", "rayguard.exceptions.ConfigError")
    assert tuple(died[1][k] for k in fields[:3]) == ("kill", False, "retried")
    assert "injected kill" in died[1]["detail"]
    assert tuple(died[2][k] for k in fields[:3]) == ("error", False, "after_one_repeat")
    assert all("cause" not in e for e in died.values())  # one cause field: failure


def test_a_failure_after_an_in_place_rollback_is_the_rollbacks_attempt(coordinator, events) -> None:
    callback = RayGuardCallback(coordinator)
    callback.before_worker_group_start(None)
    opened = coordinator.target.open_attempt("in_place")  # rank 0 rolled back in the workers
    callback.after_worker_group_poll_status(status({0: ValueError("bad")}))
    assert callback._attempt == opened.number == 1
    assert [e["attempt"] for e in events() if e["kind"] == "worker_died"] == [1]


def test_a_coordinator_that_does_not_say_its_attempt_is_logged_with_what_it_means(
        coordinator, events, caplog) -> None:
    from ray.exceptions import GetTimeoutError

    class Slow:
        def __getattr__(self, name):
            if name == "latest_attempt":
                raise GetTimeoutError("no answer in 10 s")
            return getattr(coordinator, name)

    callback = RayGuardCallback(Slow())
    callback.before_worker_group_start(None)
    coordinator.target.open_attempt("in_place")
    with caplog.at_level("WARNING", logger="rayguard"):
        callback.after_worker_group_poll_status(status({0: ValueError("bad")}))
    assert "recorded under attempt 0, the group's own" in caplog.text
    assert [e["attempt"] for e in events() if e["kind"] == "worker_died"] == [0]


def test_a_coordinator_behind_the_controller_raises(coordinator, tmp_path) -> None:
    from rayguard.exceptions import RayGuardError
    from rayguard.run.coordinator import RunCoordinator

    callback = RayGuardCallback(coordinator)
    callback.before_worker_group_start(None)
    callback.before_worker_group_start(None)
    coordinator.target = RunCoordinator(str(tmp_path / "other.jsonl"))  # the run's attempts lost
    with pytest.raises(RayGuardError, match="latest attempt is None, before attempt 1"):
        callback.after_worker_group_poll_status(status({0: ValueError("bad")}))
