"""Ray Train failure policy that never retries errors a restart cannot fix."""

from __future__ import annotations

from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from rayguard.exceptions import ConfigError, PreflightError, WorkerSetupError

# A bad config, a failed preflight or an impossible device mapping is the same on every
# attempt: retrying only burns the restart budget and hides the message.
FATAL_ERRORS: tuple[type[BaseException], ...] = (ConfigError, PreflightError, WorkerSetupError)


def is_fatal(error: BaseException) -> bool:
    return isinstance(error, FATAL_ERRORS) or bool(getattr(error, "fatal", False))


class GuardFailurePolicy(DefaultFailurePolicy):
    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        if isinstance(training_failed_error, WorkerGroupError) and any(
            is_fatal(getattr(e, "_base_exc", e))
            for e in training_failed_error.worker_failures.values()
        ):
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)
