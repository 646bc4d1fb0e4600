"""The names of the run's facts: the one place a fact's key is built and read back.

A fact is a value a worker leaves with the run's coordinator (``RunLink.mark``/``put``) for
another process to read: the controller, the driver, a peer. Each kind has one builder
here, and the keys that carry a rank are parsed back only here (:func:`rank_fact`), so no
module builds a key string that another one takes apart.
"""

from __future__ import annotations

from typing import NamedTuple

CAUSE = "cause"
"""Why a rank is going (``"injected kill"``, ``"killed by rayguard: stall"``): left before it
goes, so that the crash-loop rule and the controller know a kill from a crash."""
KILLED = "killed"
"""The watchdog's reason for killing a rank (the driver's final error names it)."""


class RankFact(NamedTuple):
    kind: str
    attempt: int
    rank: int


RETURNED = "returned"
"""The ranks of the running worker group whose training function returned (the controller
puts it; :mod:`rayguard.health.report_wait` reads it)."""


def cause_key(attempt: int, rank: int) -> str:
    return f"{CAUSE}:{attempt}:{rank}"


def killed_key(attempt: int, rank: int) -> str:
    return f"{KILLED}:{attempt}:{rank}"


def loaded_key(attempt: int) -> str:
    """The checkpoint an attempt resumed from (the crash-loop rule reads it)."""
    return f"loaded:{attempt}"


def rank_fact(key: str) -> RankFact | None:
    """``key`` read back when it is a rank's fact (:func:`cause_key`, :func:`killed_key`),
    else ``None``."""
    parts = key.split(":")
    if len(parts) != 3 or parts[0] not in (CAUSE, KILLED):
        return None
    try:
        return RankFact(parts[0], int(parts[1]), int(parts[2]))
    except ValueError:
        return None


__all__ = ["CAUSE", "KILLED", "RankFact", "cause_key", "killed_key", "loaded_key", "rank_fact"]
