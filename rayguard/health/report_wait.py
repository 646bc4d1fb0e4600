"""A rank that waits in ``ray.train.report`` after every other rank's training function
returned.

Ray's report meets every rank of the group, so a rank that reports more often than its
peers (a report only rank 0 makes, a loop whose ranks run different numbers of steps) waits
for ever; Ray only warns, every minute, that ranks have not joined. rayguard's worker counts a
wait in a report as progress (its peers may be in a long step), so the progress watchdog
cannot see it. Instead the controller puts the ranks of the running group whose training
function returned (:func:`finished_ranks`, the fact :data:`~rayguard.run.facts.RETURNED`),
and a rank that has waited in one report for ``check_after_s`` reads it every ``every_s``
(:class:`ReportWait`): once every other rank returned, it raises
:class:`~rayguard.exceptions.UnmatchedReportError`, which ends the run (a restart would do
the same) with a message that says what happened and the fix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from rayguard.exceptions import UnmatchedReportError

logger = logging.getLogger("rayguard")

__all__ = ["CHECK_AFTER_S", "CHECK_EVERY_S", "ReportWait", "finished_ranks"]

CHECK_AFTER_S = 30.0
"""How long a report waits before it asks which ranks returned (a peer that is only slow to
report is the usual case: no question asked for it)."""
CHECK_EVERY_S = 10.0
"""How often a long wait asks again."""


def finished_ranks(statuses: Mapping[int, Any]) -> list[int]:
    """The ranks of a worker-group poll (Ray's ``WorkerStatus`` by rank) whose training
    function returned: no longer running, no error."""
    return sorted(rank for rank, status in statuses.items()
                  if not getattr(status, "running", True) and getattr(status, "error", None) is None)


class ReportWait:
    """Called about once a second while this rank waits in one ``ray.train.report``
    (``progress``: the watchdog's heartbeat, called every time); ``read()``: the ranks that
    returned (the controller's fact; ``None``: not known)."""

    def __init__(self, progress: Callable[[], None], read: Callable[[], Any], *, rank: int,
                 world_size: int, report: int, clock: Callable[[], float] = time.monotonic,
                 check_after_s: float = CHECK_AFTER_S, every_s: float = CHECK_EVERY_S) -> None:
        self.progress, self.read = progress, read
        self.rank, self.world_size, self.report = rank, world_size, report
        self.clock, self.every_s = clock, every_s
        self.started = clock()
        self._next = self.started + check_after_s

    def __call__(self) -> None:
        self.progress()
        now = self.clock()
        if now < self._next or self.world_size < 2:
            return
        self._next = now + self.every_s
        try:
            returned = set(self.read() or ())
        except Exception as exc:  # not known: keep waiting, as Ray does
            logger.debug("rayguard: the ranks that returned are not known: %s", exc)
            return
        others = set(range(self.world_size)) - {self.rank}
        if others <= returned:
            raise UnmatchedReportError(
                f"rank {self.rank} has waited {now - self.started:.0f} s in its "
                f"ray.train.report (report {self.report} of this worker) after every other "
                f"rank's training function returned (ranks {_ranks(others)}): Ray's report "
                "waits for every rank of the group, so it would wait for ever. Fix: call "
                "ray.train.report the same number of times on every rank (a report made on "
                "rank 0 only, or a loop whose ranks run different numbers of steps, waits "
                "like this); after a recovery every rank starts again from the same "
                "checkpoint, so a count that depends on the attempt differs between ranks")


def _ranks(ranks: set[int]) -> str:
    listed = sorted(ranks)
    return str(listed) if len(listed) <= 8 else f"[{listed[0]}..{listed[-1]}] ({len(listed)})"
