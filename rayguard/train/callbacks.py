"""Controller-side hooks (these run in Ray Train's controller actor): count attempts, and
write worker deaths and restarts into the run's event log."""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from rayguard.events import make_event


def _describe(error: BaseException) -> str:
    error = getattr(error, "_base_exc", error)
    text = f"{type(error).__name__}: {error}"
    return text if len(text) < 1500 else text[:1500] + " ..."


class RayGuardCallback(WorkerGroupCallback, ControllerCallback):
    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self._attempt = -1
        self._reported: set[tuple[int, int]] = set()

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        """Runs in the controller before each worker group starts: a new attempt."""
        import ray

        self._attempt = ray.get(self.coordinator.new_attempt.remote())

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        """Runs in the controller after each poll: record every worker error once."""
        for rank, error in worker_group_status.errors.items():
            if (self._attempt, rank) in self._reported:
                continue
            self._reported.add((self._attempt, rank))
            self.coordinator.record.remote(make_event(
                "worker_died", f"rank {rank} failed: {_describe(error)}", rank=rank,
                attempt=self._attempt))

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        """Runs in the controller when a failure was handled: RETRY means a restart."""
        decision = getattr(failure_decision, "value", str(failure_decision))
        if decision == "RETRY":
            self.coordinator.record.remote(make_event(
                "restart", f"worker group restarts after attempt {self._attempt}",
                attempt=self._attempt))
