"""Controller-side hooks (these run in Ray Train's controller actor): count attempts, and
write worker deaths and restarts into the run's event log."""

from __future__ import annotations

from typing import Any

from rayguard._ray.train import ControllerCallback, WorkerGroupCallback, unwrap_worker_error
from rayguard.events import make_event


def describe_failure(error: BaseException, marked: str | None) -> tuple[str, str, str]:
    """``(cause, one-line reason, details)`` of a worker's failure.

    ``cause`` is a short label (``injected kill``, ``stall``, ``nan``, ``died``, ``error``);
    ``marked`` is what the worker left with the coordinator before it went (an injected
    fault, or rayguard's watchdog killing it). A NaN the guard detected reads as ``nan``
    even when the NaN was injected (the reason says so): the guard is what stopped it."""
    from rayguard.exceptions import NonFiniteMetricError

    error = unwrap_worker_error(error)
    details = f"{type(error).__name__}: {error}"
    lines = [line for line in str(error).splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    died = hasattr(error, "health_check_failure") or type(error).__name__ in (
        "RayActorError", "ActorDiedError", "ActorUnavailableError")
    if isinstance(error, NonFiniteMetricError):
        injected = " (the NaN was injected: RAYGUARD_FAULTS)" if marked == "injected nan" else ""
        cause, reason = "nan", f"{type(error).__name__}: {first[:300]}{injected}"
    elif marked and marked.startswith("injected"):
        cause, reason = marked, f"{marked} (RAYGUARD_FAULTS)"
    elif marked and marked.startswith("killed by rayguard"):
        cause, reason = marked.rsplit(": ", 1)[-1], f"{marked} (see the stall_detected event)"
    elif died:
        cause, reason = "died", f"worker process died ({type(error).__name__}: {first[:200]})"
    else:
        cause, reason = "error", f"{type(error).__name__}: {first[:300]}"
    return cause, reason, details[:20000]


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
        """Runs in the controller after each poll: record every worker error once, as one
        line (its cause: an injected fault, rayguard's watchdog, a death, an exception) plus
        the whole text in ``details``."""
        import ray

        for rank, error in worker_group_status.errors.items():
            if (self._attempt, rank) in self._reported:
                continue
            self._reported.add((self._attempt, rank))
            try:
                marked = ray.get(self.coordinator.get.remote(f"cause:{self._attempt}:{rank}"),
                                 timeout=10)
            except Exception:
                marked = None
            cause, reason, details = describe_failure(error, marked)
            self.coordinator.record.remote(make_event(
                "worker_died", f"rank {rank} failed: {reason}", rank=rank,
                attempt=self._attempt, cause=cause, details=details))

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        """Runs in the controller when a failure was handled: RETRY means a restart."""
        decision = getattr(failure_decision, "value", str(failure_decision))
        if decision == "RETRY":
            self.coordinator.record.remote(make_event(
                "restart", f"worker group restarts after attempt {self._attempt}",
                attempt=self._attempt))
