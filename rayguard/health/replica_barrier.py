"""A report the survivors of a replica-group replacement wait in, that the replacement will
never join (Ray's ``TorchftConfig``): when to release them.

Ray Train replaces a failed replica group alone (``WorkerGroup.replace_replica_group``) and
resets the group's report barrier as it does, so that a survivor waiting in
``ray.train.report`` skips that report (Ray logs "Synchronization barrier was reset ...
Skipping this report"). A survivor that reaches the barrier just after that reset (it was a
few hundred milliseconds behind its peer, which failed at the same report) waits there for
the replacement, while the replacement waits in torchft's quorum for the survivor: neither
moves until torchft's quorum timeout fails the replacement (60 s by default), one failure
more against ``FailureConfig(max_failures)``.

Under torchft a replacement joins no report before it has trained a step with the survivors
(their quorum heals it first), and trained in step with them it reaches the report within
moments of them. So after a replacement, until each replaced rank has reported once (or
been seen in the barrier), the controller looks at the barrier at most every ``every_s``
(:class:`ReplicaBarrierWatch`): survivors alone in it for ``after_s`` or more wait for a
report that will not come, and the barrier is reset again (:class:`StaleReport`): they skip
that report, as Ray's own reset makes them, and meet the replacement in torchft's quorum.
Pure: the controller reads the barrier and resets it
(:mod:`rayguard.controller.replica_barrier`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["CHECK_EVERY_S", "STALE_AFTER_S", "BarrierView", "ReplicaBarrierWatch", "StaleReport"]

STALE_AFTER_S = 5.0
"""How long survivors wait alone in a report, after a replacement of their peers that has
not reported yet, before the report is taken for one the replacement will not join (in step
with the survivors it arrives within moments of them)."""
CHECK_EVERY_S = 0.5
"""How often the controller looks at the barrier while a replacement has not reported."""


@dataclass(frozen=True)
class BarrierView:
    """The ranks waiting in the group's report barrier and how long the first of them has
    waited (0.0 when none waits)."""

    arrived: frozenset[int]
    waited_s: float = 0.0


@dataclass(frozen=True)
class StaleReport:
    """The decision: the barrier is reset; ``survivors`` skip the report they wait in, which
    the ``replaced`` ranks will not join."""

    survivors: tuple[int, ...]
    replaced: tuple[int, ...]
    waited_s: float

    @property
    def message(self) -> str:
        return (f"rank(s) {list(self.survivors)} released from the ray.train.report they waited "
                f"in for {self.waited_s:.1f} s: replaced rank(s) {list(self.replaced)} will not "
                "join it (they meet the survivors in torchft's quorum first); the report is "
                "skipped, as at Ray's own reset of the barrier when it replaced them")

    def event_fields(self) -> dict[str, Any]:
        return {"ranks": list(self.survivors), "replaced": list(self.replaced),
                "waited_s": round(self.waited_s, 3)}


class ReplicaBarrierWatch:
    """The replaced ranks that have not reported since their replacement, and the decision
    on each look at the barrier (the module's docstring). ``clock``: monotonic seconds."""

    def __init__(self, *, after_s: float = STALE_AFTER_S, every_s: float = CHECK_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s, self.every_s, self.clock = after_s, every_s, clock
        self._pending: set[int] = set()
        self._next = float("-inf")

    @property
    def pending(self) -> frozenset[int]:
        """The replaced ranks that have not reported yet."""
        return frozenset(self._pending)

    def replaced(self, ranks: Iterable[int]) -> None:
        """Ray replaces ``ranks``' replica groups."""
        self._pending |= set(ranks)

    def clear(self) -> None:
        """A new worker group: nothing replaced in it yet."""
        self._pending.clear()
        self._next = float("-inf")

    def settled(self, ranks: Iterable[int]) -> None:
        """``ranks`` reported (or stopped running): their replacement is over."""
        self._pending -= set(ranks)

    def due(self) -> bool:
        """Whether to look at the barrier now (a replacement has not reported, and the last
        look was ``every_s`` ago)."""
        now = self.clock()
        if not self._pending or now < self._next:
            return False
        self._next = now + self.every_s
        return True

    def decide(self, view: BarrierView) -> StaleReport | None:
        """What the barrier as ``view`` shows calls for: a replaced rank in it has reached a
        report (its replacement is over); survivors alone in it for ``after_s`` or more wait
        for a report it will not join (reset); anything else waits."""
        if view.arrived & self._pending:
            self._pending -= view.arrived
            return None
        if not self._pending or not view.arrived or view.waited_s < self.after_s:
            return None
        return StaleReport(tuple(sorted(view.arrived)), tuple(sorted(self._pending)),
                           view.waited_s)
