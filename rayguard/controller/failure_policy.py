"""Ray Train failure policy that never retries errors a restart cannot fix.

Two kinds: errors deterministic by construction (a bad config, a failed preflight, an
impossible device mapping, a state that cannot be checkpointed: ``classify(...).fatal``, by
the one table of :mod:`rayguard.failures.fatal`), and
crash loops (the same exception from the same frame ending consecutive attempts with no
durable progress: :mod:`rayguard.health.crash_loop`). Either ends the run at once; the
reason is left with the run's coordinator so that the driver raises the user's exception
with rayguard's whole message. Everything else follows Ray's own budget
(``FailureConfig(max_failures=...)``). Workers that rayguard's controller callback marked
failed to restart the whole group (:func:`rayguard._ray.train.fail_every_worker`) are not
counted as failures here.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from rayguard._ray.train import (
    FailureDecision,
    QuietRetryPolicy,
    marked_failed,
    replacement_met_a_dead_worker,
    unwrap_worker_error,
)
from rayguard.events import make_event
from rayguard.failures import FATAL_ERRORS, classify
from rayguard.failures.messages import one_line
from rayguard.health.crash_loop import no_progress

logger = logging.getLogger("rayguard")

__all__ = ["FATAL_ERRORS", "STOP_REASON_KEY", "GuardFailurePolicy"]

STOP_REASON_KEY = "stop_reason"
"""Coordinator key under which the policy leaves why it ended the run (read by the driver)."""


class GuardFailurePolicy(QuietRetryPolicy):
    """Runs in Ray Train's controller actor; ``coordinator`` is the run's coordinator."""

    def __init__(self, failure_config: Any, coordinator: Any = None,
                 crash_loop_retries: int = 1) -> None:
        super().__init__(failure_config)
        self.coordinator = coordinator
        self.crash_loop_retries = crash_loop_retries

    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        if replacement_met_a_dead_worker(training_failed_error):
            # live recovery: two workers died close together; the whole group restarts
            logger.info("rayguard: a worker replaced alone found another worker of its group "
                        "dead too (%s): the whole worker group restarts",
                        one_line(training_failed_error))
            return self.retry_as_worker_failure()
        if isinstance(training_failed_error, WorkerGroupError):
            failures = {rank: error for rank, error in
                        training_failed_error.worker_failures.items()
                        if not marked_failed(error)}  # not the workers marked for a restart
            classified = {rank: classify(unwrap_worker_error(e)) for rank, e in failures.items()}
            fatal = sorted(rank for rank, failure in classified.items() if failure.fatal)
            if fatal:
                rank, error = fatal[0], failures[fatal[0]]
                self._stop("fatal", rank, f"{type(error).__name__} is not retried: a restart "
                           "cannot fix it", cause=classified[rank].cause,
                           retry=classified[rank].retry)
                return FailureDecision.RAISE
            loop = self._crash_loop(len(failures))
            if loop is not None and self._reject_loaded(loop):
                return super().make_decision(training_failed_error)
            if loop is not None:
                self._stop("crash_loop", loop.rank, (
                    f"crash loop: {loop.summary} (raised at {loop.origin}) ended attempt "
                    f"{loop.attempt} on rank {loop.rank} exactly as before, {no_progress(loop)}"
                    f"; {_allowed(self.crash_loop_retries)}, so it is not retried"),
                    attempt=loop.attempt)
                return FailureDecision.RAISE
        return super().make_decision(training_failed_error)

    def _crash_loop(self, failed_ranks: int) -> Any:
        if self.coordinator is None:
            return None
        import ray

        try:
            return ray.get(self.coordinator.crash_loop.remote(failed_ranks, self.crash_loop_retries),
                           timeout=30)
        except Exception as exc:  # no verdict: fall back to Ray's budget
            logger.warning("rayguard: crash-loop check unavailable: %s", exc)
            return None

    def _reject_loaded(self, loop: Any) -> bool:
        """A loop whose attempts all resumed from one checkpoint that verified: the loop
        cannot load it (a framework's format error, a DCP load error). Reject it, so the
        next attempt is offered the next older one; True when one was rejected."""
        if self.coordinator is None:
            return False
        import ray

        attempts = list(range(loop.attempt - self.crash_loop_retries, loop.attempt + 1))
        try:
            path = ray.get(self.coordinator.loaded_checkpoint.remote(attempts), timeout=30)
            if not path:
                return False
            why = (f"{path}: attempts {attempts[0]}-{attempts[-1]} resumed from it and failed "
                   f"the same way ({loop.summary} at {loop.origin}): the loop cannot load it")
            ray.get([self.coordinator.reject_checkpoint.remote(path, why),
                     self.coordinator.record.remote(make_event(
                         "checkpoint_rejected", f"skipped {why}; the next attempt resumes "
                         "from the next older checkpoint", rank=loop.rank, path=path,
                         attempt=loop.attempt))], timeout=30)
        except Exception as exc:
            logger.warning("rayguard: could not reject the checkpoint of a crash loop: %s", exc)
            return False
        logger.info("rayguard: %s", why)
        return True

    def _stop(self, kind: str, rank: int, reason: str, **extra: Any) -> None:
        logger.info("rayguard: %s", reason)
        if self.coordinator is None:
            return
        import ray

        try:
            ray.get([self.coordinator.put.remote(STOP_REASON_KEY, {"kind": kind, "rank": rank,
                                                                   "reason": reason}),
                     self.coordinator.record.remote(make_event(
                         "crash_loop" if kind == "crash_loop" else "not_retried", reason,
                         rank=rank, **extra))], timeout=30)
        except Exception as exc:
            logger.warning("rayguard: could not record why the run stops: %s", exc)


def _allowed(retries: int) -> str:
    """``HealthConfig(crash_loop_retries=N)`` in words: how many repeats it allows."""
    count = "no repeat" if retries == 0 else f"{retries} repeat{'s' if retries != 1 else ''}"
    return f"HealthConfig(crash_loop_retries={retries}) allows {count}"
