"""classify(): one cause, reason, fatal flag and retry policy per worker failure (no Ray)."""

from __future__ import annotations

import pickle

import pytest

from rayguard.exceptions import (
    CheckpointError,
    ConfigError,
    InjectedFault,
    NonFiniteMetricError,
    PreflightError,
    StateNotCheckpointableError,
    UnknownFieldError,
    WorkerSetupError,
)
from rayguard.failures import CAUSES, RETRY_POLICIES, Failure, classify, most_severe
from rayguard.failures.taxonomy import is_kill_mark
from rayguard.faults.spec import CONFIG_SOURCE, ENV_SOURCE, injected_mark

RAY_DEATH = ("The actor died unexpectedly before finishing this task. The actor is dead "
             "because its worker process has died.")


class ActorDiedError(Exception):
    """Named like Ray's: a worker process that died."""


class WorkerHealthCheckFailedError(Exception):
    health_check_failure = None


def test_a_failure_is_a_small_frozen_record() -> None:
    failure = classify(ValueError("my bug\ntrace"))
    assert isinstance(failure, Failure)
    with pytest.raises(AttributeError):
        failure.cause = "kill"  # type: ignore[misc]
    assert (failure.cause, failure.label, failure.reason) == ("error", "error", "ValueError: my bug")
    assert failure.fatal is False and failure.retry == "after_one_repeat"
    assert failure.error_type == "builtins.ValueError" and failure.summary == "ValueError: my bug"
    assert failure.details == "ValueError: my bug\ntrace"
    assert failure.cause in CAUSES and failure.retry in RETRY_POLICIES


def test_origin_is_the_innermost_frame() -> None:
    def boom() -> None:
        raise KeyError("k")

    try:
        boom()
    except KeyError as exc:
        failure = classify(exc)
    assert failure.origin.endswith("in boom") and "test_taxonomy.py" in failure.origin
    assert classify(KeyError("k")).origin == "<unknown>"  # crossed a process: no traceback


@pytest.mark.parametrize("error, cause", [
    (ConfigError("GuardConfig(seed=-1)"), "config"),
    (UnknownFieldError("HealthConfig(x=1)"), "config"),
    (PreflightError("preflight"), "preflight"),
    (WorkerSetupError("no such GPU"), "setup"),
    (StateNotCheckpointableError("a lambda"), "checkpoint"),
])
def test_what_a_restart_cannot_fix_is_not_retried(error: BaseException, cause: str) -> None:
    failure = classify(error)
    assert (failure.cause, failure.fatal, failure.retry) == (cause, True, "not_retried")
    again = classify(pickle.loads(pickle.dumps(error)))  # as it crosses actors
    assert (again.cause, again.fatal) == (cause, True)


def test_a_class_outside_exceptions_joins_the_table_by_its_fatal_attribute() -> None:
    class FatalNaN(NonFiniteMetricError):
        fatal = True

    class BadSharding(CheckpointError):
        fatal = True

    class Other(RuntimeError):
        fatal = True

    assert (classify(FatalNaN("x")).cause, classify(FatalNaN("x")).retry) == ("nan", "not_retried")
    assert classify(BadSharding("x")).cause == "checkpoint" and classify(BadSharding("x")).fatal
    assert classify(Other("x")).cause == "error" and classify(Other("x")).fatal


def test_a_death_is_retried_and_reads_as_kill() -> None:
    for death in (ActorDiedError(RAY_DEATH), WorkerHealthCheckFailedError("health check\ndump")):
        failure = classify(death)
        assert (failure.cause, failure.label, failure.retry) == ("kill", "died", "retried")
        assert failure.reason.startswith("worker process died (") and "\n" not in failure.reason


def test_the_workers_mark_names_injected_faults_and_watchdog_kills() -> None:
    for source in (CONFIG_SOURCE, ENV_SOURCE):  # the reason names where it was given
        kill = classify(ActorDiedError(RAY_DEATH), injected_mark("kill", source))
        assert (kill.cause, kill.label, kill.reason, kill.retry) == (
            "kill", "injected kill", f"injected kill ({source})", "retried")
        assert is_kill_mark(injected_mark("kill", source))
    old = classify(ActorDiedError(RAY_DEATH), "injected kill")  # a mark with no source
    assert (old.label, old.reason) == (
        "injected kill", "injected kill (GuardConfig(faults=...) or RAYGUARD_FAULTS)")
    assert is_kill_mark("injected kill") and not is_kill_mark(injected_mark("raise", ENV_SOURCE))
    stall = classify(RuntimeError("x"), "killed by rayguard: stall")
    assert (stall.cause, stall.label, stall.retry) == ("hang", "stall", "retried")
    assert "stall_detected" in stall.reason
    startup = classify(ActorDiedError(RAY_DEATH), "killed by rayguard: startup")
    assert (startup.cause, startup.label) == ("hang", "startup")
    raised = classify(InjectedFault("injected fault raise"), "injected raise")
    assert (raised.cause, raised.label, raised.retry) == ("error", "injected raise",
                                                          "after_one_repeat")


def test_a_nan_reads_as_nan_even_when_injected() -> None:
    failure = classify(NonFiniteMetricError("loss is nan at step 4"),
                       injected_mark("nan", ENV_SOURCE))
    assert (failure.cause, failure.label, failure.fatal) == ("nan", "nan", False)
    assert failure.reason.endswith("(the NaN was injected: RAYGUARD_FAULTS)")
    failure = classify(NonFiniteMetricError("loss is nan at step 4"),
                       injected_mark("nan", CONFIG_SOURCE))
    assert failure.reason.endswith("(the NaN was injected: GuardConfig(faults=...))")


def test_out_of_memory_and_preemption_are_read_from_the_errors_text() -> None:
    oom = classify(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert (oom.cause, oom.retry) == ("oom", "after_one_repeat")  # an exception: may loop
    ray_oom = classify(ActorDiedError("Task was killed due to the node running low on memory"))
    assert (ray_oom.cause, ray_oom.retry) == ("oom", "retried")
    node = classify(ActorDiedError("NodeDiedError: the node was preempted"))
    assert node.cause == "preemption" and node.retry == "retried"


def test_an_error_caused_by_a_peers_loss_is_retried_never_a_crash_loop() -> None:
    reset = classify(RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection "
                                  "reset by peer"))
    assert (reset.cause, reset.retry) == ("error", "retried")


def test_an_attempt_reads_as_its_most_severe_cause() -> None:
    assert most_severe(["error", "kill"]) == "kill"
    assert most_severe(["kill", "oom", "error"]) == "oom"
    assert most_severe(["kill", "hang"]) == "hang"
    assert most_severe(["what", "error"]) == "error"
    assert most_severe([]) == "unknown"
