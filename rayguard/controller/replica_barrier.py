"""After Ray's replacement of a replica group (``TorchftConfig``): survivors released from a
report the replacement will not join, in Ray Train's controller.

The decision is :class:`rayguard.health.replica_barrier.ReplicaBarrierWatch`'s; this module
reads the group's report barrier (:func:`rayguard._ray.resize.barrier_waiters`) at the
controller's polls while a replacement has not reported, resets it
(:func:`rayguard._ray.resize.reset_barrier`) when the watch says so, and records a
``report_released`` event. A barrier that cannot be read or reset (a Ray whose actor keeps
no waiters, an actor gone) leaves Ray's own behaviour as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from rayguard.events import make_event
from rayguard.health.replica_barrier import BarrierView, ReplicaBarrierWatch

logger = logging.getLogger("rayguard")

__all__ = ["ReplicaBarrier"]


class ReplicaBarrier:
    """The controller's side of one run's watch; ``coordinator`` records the events."""

    def __init__(self, coordinator: Any, watch: ReplicaBarrierWatch | None = None) -> None:
        self.coordinator = coordinator
        self.watch = watch or ReplicaBarrierWatch()
        self._group: Any = None

    def started(self, worker_group: Any) -> None:
        """A new worker group (its own barrier; nothing replaced in it yet)."""
        self._group = worker_group
        self.watch.clear()

    def replaced(self, ranks: Iterable[int]) -> None:
        """Ray replaces ``ranks``' replica groups now."""
        self.watch.replaced(ranks)

    def poll(self, statuses: Mapping[int, Any], attempt: int) -> None:
        """After a poll (Ray's ``WorkerStatus`` by rank): a replaced rank that reported, or
        that no longer runs, is done with; then, when due, look at the barrier."""
        if self._group is None or not self.watch.pending:
            return
        self.watch.settled(rank for rank, status in statuses.items()
                           if getattr(status, "training_report", None) is not None
                           or not getattr(status, "running", True))
        if not self.watch.due():
            return
        from rayguard._ray.resize import barrier_waiters, reset_barrier

        try:
            read = barrier_waiters(self._group)
        except Exception as exc:  # the actor gone with the group: its restart handles it
            logger.debug("rayguard: report barrier not read: %s", exc)
            return
        if read is None:  # a Ray that does not say who waits: its own reset stands alone
            self.watch.clear()
            return
        stale = self.watch.decide(BarrierView(frozenset(read[0]), read[1]))
        if stale is None:
            return
        try:
            reset_barrier(self._group)
        except Exception as exc:
            logger.debug("rayguard: report barrier not reset: %s", exc)
            return
        self.coordinator.record.remote(make_event("report_released", stale.message,
                                                  attempt=attempt, **stale.event_fields()))
