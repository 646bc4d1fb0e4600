"""GuardFailurePolicy and fatal classification on Ray's own error objects, with the run's
real coordinator called in process: what is never retried, what a crash loop ends, and
what falls through to Ray's budget."""

from __future__ import annotations

import pickle

import pytest
from ray.train import FailureConfig
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
from ray.train.v2.api.exceptions import WorkerGroupError

from rayguard._ray.train import FailureDecision, unwrap_worker_error
from rayguard.controller.failure_policy import STOP_REASON_KEY, GuardFailurePolicy
from rayguard.exceptions import (
    CheckpointError,
    ConfigError,
    NonFiniteMetricError,
    PreflightError,
    StateNotCheckpointableError,
    WorkerSetupError,
)
from rayguard.failures import classify


def is_fatal(error: BaseException) -> bool:
    """The policy's test: the failure taxonomy's verdict on the error inside Ray's wrapper."""
    return classify(unwrap_worker_error(error)).fatal


def wrapped(error: BaseException) -> UserExceptionWithTraceback:
    """A worker's exception as Ray Train hands it to the failure policy."""
    return UserExceptionWithTraceback(error, f"Traceback ...\n{type(error).__name__}: {error}")


def group_error(failures: dict[int, BaseException]) -> WorkerGroupError:
    """What the controller hands the policy: Ray unwraps each worker's error
    (``WorkerGroupPollStatus.errors``) before building this."""
    return WorkerGroupError("worker group failed", failures)


@pytest.mark.parametrize("error, fatal", [
    (ConfigError("GuardConfig(seed=-1): ..."), True),
    (PreflightError("preflight"), True),
    (WorkerSetupError("no such GPU"), True),
    (StateNotCheckpointableError("a lambda"), True),  # fatal = True on the class
    (NonFiniteMetricError("loss is nan"), False),
    (CheckpointError("disk full"), False),
    (RuntimeError("NCCL timeout"), False),
])
def test_fatal_classification_looks_inside_rays_wrapper(error: BaseException, fatal: bool) -> None:
    assert is_fatal(error) is fatal
    assert is_fatal(wrapped(error)) is fatal
    assert is_fatal(pickle.loads(pickle.dumps(wrapped(error)))) is fatal  # as it crosses actors


def test_a_fatal_error_is_raised_at_once_and_the_reason_left_for_the_driver(coordinator, events) -> None:
    policy = GuardFailurePolicy(FailureConfig(max_failures=5), coordinator)
    failures = {1: RuntimeError("collateral"), 0: ConfigError("bad value")}
    assert policy.make_decision(group_error(failures)) == FailureDecision.RAISE
    stop = coordinator.target.get(STOP_REASON_KEY)
    assert stop["kind"] == "fatal" and stop["rank"] == 0 and "ConfigError is not retried" in stop["reason"]
    assert [e["kind"] for e in events()] == ["not_retried"]


def test_the_lowest_fatal_rank_is_named() -> None:
    policy = GuardFailurePolicy(FailureConfig(max_failures=5))  # no coordinator: nothing stored
    failures = {3: PreflightError("p"), 2: wrapped(WorkerSetupError("w"))}
    assert policy.make_decision(group_error(failures)) == FailureDecision.RAISE


def test_other_errors_follow_rays_budget(coordinator, events) -> None:
    policy = GuardFailurePolicy(FailureConfig(max_failures=2), coordinator)
    error = group_error({0: RuntimeError("flaky")})
    decisions = []
    for origin in ("a.py:1 in f", "b.py:2 in g", "c.py:3 in h"):  # never the same twice: no loop
        coordinator.target.open_attempt("restart")
        coordinator.target.record_failure(0, coordinator.target.attempt(), "builtins.RuntimeError",
                                          origin, step=-1, summary="RuntimeError: flaky")
        decisions.append(policy.make_decision(error))
    assert decisions == [FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]
    assert coordinator.target.get(STOP_REASON_KEY) is None and events() == []


def test_a_repeated_failure_with_no_progress_is_a_crash_loop(coordinator, events) -> None:
    policy = GuardFailurePolicy(FailureConfig(max_failures=10), coordinator, crash_loop_retries=1)
    error = group_error({0: ValueError("my bug")})
    decisions = []
    for _ in range(2):
        coordinator.target.open_attempt("restart")
        coordinator.target.record_failure(0, coordinator.target.attempt(), "builtins.ValueError",
                                          "train.py:3 in train_fn", step=-1, summary="ValueError: my bug")
        decisions.append(policy.make_decision(error))
    assert decisions == [FailureDecision.RETRY, FailureDecision.RAISE]
    stop = coordinator.target.get(STOP_REASON_KEY)
    assert stop["kind"] == "crash_loop" and "crash_loop_retries=1" in stop["reason"]
    assert [(e["kind"], e["attempt"]) for e in events()] == [("crash_loop", 1)]


def test_an_unreachable_coordinator_falls_back_to_rays_budget() -> None:
    class Gone:
        def __getattr__(self, name):
            raise ConnectionError("actor died")

    policy = GuardFailurePolicy(FailureConfig(max_failures=1), Gone())
    assert policy.make_decision(group_error({0: RuntimeError("x")})) == FailureDecision.RETRY
    assert policy.make_decision(group_error({0: ConfigError("x")})) == FailureDecision.RAISE


def test_the_policy_pickles_for_the_controller_actor() -> None:
    policy = pickle.loads(pickle.dumps(GuardFailurePolicy(FailureConfig(max_failures=3), None, 2)))
    assert policy.crash_loop_retries == 2 and policy.failure_config.max_failures == 3
