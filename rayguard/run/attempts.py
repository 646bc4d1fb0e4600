"""The run's attempts, one owner: :class:`Attempts` (held by the run's coordinator,
:mod:`rayguard.run.coordinator`) numbers every attempt and returns what it opened.

An attempt opens in three ways, each a :class:`~rayguard.health.recovery.RecoveryKind`:
a whole worker group starts (``RESTART``: the controller, before each group start, the
run's first included), Ray replaces failed ranks alone and the survivors rejoin (``LIVE``:
the controller, before the replacement starts), or every rank rolls back in place
(``ROLLBACK``: rank 0, :mod:`rayguard.train.rollback`). Each of them asks the coordinator's
``open_attempt``; none counts on its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from rayguard.health.recovery import LIVE, RESIZE, RecoveryKind


@dataclass(frozen=True)
class Attempt:
    """One attempt as it was opened (crosses Ray processes: plain, picklable)."""

    number: int
    """0 for the run's first, then one more per opening."""
    kind: RecoveryKind
    """How it opened: ``RESTART`` (a whole group starts), ``LIVE``, ``RESIZE`` (an elastic
    group resized in place, :mod:`rayguard.controller.resize`) or ``ROLLBACK``."""
    replaced: tuple[int, ...] = ()
    """``LIVE``: the ranks Ray starts again alone for it (the others are its survivors);
    ``RESIZE``: the ranks it drops; empty for the other kinds."""
    opened_at: float = 0.0
    """Wall-clock time of the opening (a live attempt's notice says it too)."""


class Attempts:
    """The run's attempt counter and what each opening was (the coordinator's, one event-loop
    thread: no lock)."""

    def __init__(self) -> None:
        self._opened: list[Attempt] = []

    def open(self, kind: RecoveryKind | str, *, replaced: Iterable[int] = (),
             now: float | None = None) -> Attempt:
        """Open the next attempt; returns it. ``replaced`` only for a ``LIVE`` attempt, which
        needs at least one, or a ``RESIZE`` one (the ranks it drops; none on a grow)."""
        kind = RecoveryKind(kind)
        ranks = tuple(sorted({int(r) for r in replaced}))
        if kind == LIVE and not ranks:
            raise ValueError("Attempts.open(LIVE): a live attempt replaces at least one rank; "
                             "pass replaced=[...]")
        if kind not in (LIVE, RESIZE) and ranks:
            raise ValueError(f"Attempts.open({kind.name}, replaced={list(ranks)}): only a "
                             "live attempt replaces ranks alone")
        opened = Attempt(len(self._opened), kind, ranks,
                         time.time() if now is None else float(now))
        self._opened.append(opened)
        return opened

    @property
    def latest(self) -> Attempt | None:
        """The attempt opened last (``None``: none yet)."""
        return self._opened[-1] if self._opened else None

    @property
    def current(self) -> int:
        """The number of the attempt running now (0 before the first opens)."""
        return max(len(self._opened) - 1, 0)

    def get(self, number: int) -> Attempt | None:
        """Attempt ``number`` as it opened (``None``: not opened)."""
        if isinstance(number, bool) or not isinstance(number, int):
            return None
        return self._opened[number] if 0 <= number < len(self._opened) else None


__all__ = ["Attempt", "Attempts"]
