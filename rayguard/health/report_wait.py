"""A rank that waits in ``ray.train.report`` after every other rank's training function
returned.

Ray's report meets every rank of the group, so a rank that reports more often than its
peers (a report only rank 0 makes, a loop whose ranks run different numbers of steps) waits
for ever; Ray only warns, every minute, that ranks have not joined. rayguard's worker counts a
wait in a report as progress (its peers may be in a long step), so the progress watchdog
cannot see it. Instead the controller puts the ranks of the running group whose training
function returned (:func:`finished_ranks`, the fact :data:`~rayguard.run.facts.RETURNED`),
and a rank that has waited for ``check_after_s`` in one report (:class:`ReportWait`) or in
the ranks' agreement at a report (:class:`~rayguard.train.agreement.CollectiveAgreement`)
reads it every ``every_s`` (:class:`ReturnedCheck`): once every other rank returned, it raises
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

__all__ = ["CHECK_AFTER_S", "CHECK_EVERY_S", "ReportWait", "ReturnedCheck", "finished_ranks",
           "returned_check"]

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


class ReturnedCheck:
    """Called while this rank waits for its peers at a report (``waited_s``: how long this
    wait has lasted; ``where``: what it waits in, for the message); ``read()``: the ranks
    that returned (the controller's fact; ``None``: not known). Asks only once a wait has
    lasted ``check_after_s``, then at most every ``every_s``."""

    def __init__(self, read: Callable[[], Any], *, rank: int, world_size: int,
                 clock: Callable[[], float] = time.monotonic,
                 check_after_s: float = CHECK_AFTER_S, every_s: float = CHECK_EVERY_S) -> None:
        self.read, self.rank, self.world_size = read, rank, world_size
        self.clock, self.check_after_s, self.every_s = clock, check_after_s, every_s
        self._next = float("-inf")

    def __call__(self, waited_s: float, where: str) -> None:
        now = self.clock()
        if waited_s < self.check_after_s or now < self._next or self.world_size < 2:
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
                f"rank {self.rank} has waited {waited_s:.0f} s in {where} after every other "
                f"rank's training function returned (ranks {_ranks(others)}): a report meets "
                "every rank of the group, so it would wait for ever. Fix: report the same "
                "number of times on every rank (a report made on rank 0 only, or a loop "
                "whose ranks run different numbers of steps, waits like this); after a "
                "recovery every rank starts again from the same checkpoint, so a count that "
                "depends on the attempt differs between ranks")


def returned_check(link: Any) -> ReturnedCheck:
    """The check of a worker's ``link`` (:class:`~rayguard.run.link.RunLink`): the fact
    :data:`~rayguard.run.facts.RETURNED` read through it, its rank and world size."""
    from rayguard.run.facts import RETURNED

    return ReturnedCheck(lambda: link.get(RETURNED), rank=int(link.ctx.rank),
                         world_size=int(link.peers))


class ReportWait:
    """``forwarder.wait``'s ``on_wait`` for one ``ray.train.report``: the heartbeat
    (``progress``), then ``check`` with how long this report has waited."""

    def __init__(self, progress: Callable[[], None], check: ReturnedCheck, report: int) -> None:
        self.progress, self.check, self.report = progress, check, report
        self.started = check.clock()

    def __call__(self) -> None:
        self.progress()
        self.check(self.check.clock() - self.started,
                   f"its ray.train.report (report {self.report} of this worker)")


def _ranks(ranks: set[int]) -> str:
    listed = sorted(ranks)
    return str(listed) if len(listed) <= 8 else f"[{listed[0]}..{listed[-1]}] ({len(listed)})"
