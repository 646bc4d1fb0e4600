"""Crash loops: failures that a restart cannot fix, decided from plain data.

Each worker that ends with an exception leaves a :class:`FailureRecord` with the run's
coordinator (rank, exception type, the frame it was raised in, the last step the rank
reported, the checkpoints it committed in that attempt). A restart is pointless when the
same exception from the same frame ends consecutive attempts on the same rank and the
later attempt made no durable progress (no checkpoint committed) or failed at the same
step: the next attempt would do exactly the same. ``crash_loop_retries`` such repeats are
tolerated (one by default), then the run ends with the user's own exception.

A worker that *died* (SIGKILL, OOM, node loss, rayguard's watchdog) leaves no record, and
the errors its peers raise then are collateral (a closed connection in a collective): an
attempt with a death in it is never judged a crash loop, and an error that reads as a
peer's loss (:func:`is_collateral`: connection reset, gloo/NCCL communication errors) never
counts toward one, even when the death itself was not seen.

Progress is any durable step: a checkpoint committed through ``rayguard.train.report`` or
reported through ``ray.train.report`` (both are ``checkpoint_committed`` events), or a
failure at a later step than before.

This is the ``after_one_repeat`` row of the retry table (:mod:`rayguard.failures.fatal`,
``docs/failure-handling.md``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from rayguard.failures.patterns import COLLATERAL_PATTERNS, COLLATERAL_TYPES, reads_as_collateral
from rayguard.failures.taxonomy import classify

__all__ = ["COLLATERAL_PATTERNS", "COLLATERAL_TYPES", "FailureRecord", "crash_loop",
           "describe_exception", "is_collateral", "no_progress"]


@dataclass(frozen=True)
class FailureRecord:
    """How one rank's attempt ended with an exception."""

    rank: int
    attempt: int
    error_type: str
    """Qualified name of the exception type, e.g. ``builtins.ValueError``."""
    origin: str
    """The innermost frame of the traceback, ``file:line in function``."""
    step: int
    """The last step this rank reported in the attempt (-1: none)."""
    commits: int
    """Checkpoints committed during the attempt (as seen by this rank)."""
    summary: str
    """``Type: first line of the message``."""
    traceback: str = ""
    """The worker's formatted traceback (the cause of the driver's final exception)."""

    @property
    def signature(self) -> tuple[int, str, str]:
        return (self.rank, self.error_type, self.origin)


def is_collateral(record: FailureRecord) -> bool:
    """Whether ``record`` reads as the consequence of a peer's loss (never a crash loop;
    the patterns: :mod:`rayguard.failures.patterns`)."""
    return reads_as_collateral(record.error_type, record.summary)


def describe_exception(exc: BaseException) -> tuple[str, str, str]:
    """``(qualified type, origin frame, one-line summary)`` of an exception, as
    :func:`rayguard.failures.classify` names them."""
    failure = classify(exc)
    return failure.error_type, failure.origin, failure.summary


def _same_failure(earlier: FailureRecord, later: FailureRecord) -> bool:
    """``later`` repeats ``earlier`` and the attempt in between gained nothing durable."""
    return earlier.signature == later.signature and (
        later.commits == 0 or later.step == earlier.step)


def no_progress(record: FailureRecord) -> str:
    """Why ``record``'s repeat counted (:func:`_same_failure`), in words: nothing committed
    in its attempt, or the same step as before although it committed."""
    if record.commits == 0:
        return "with no checkpoint committed in between"
    return f"at the same step ({record.step}) although it committed a checkpoint in between"


def crash_loop(history: Mapping[int, Sequence[FailureRecord]], attempt: int, *,
               failed_ranks: int, retries: int,
               deaths: Collection[int] = ()) -> FailureRecord | None:
    """The record proving a crash loop at ``attempt``, or ``None`` (retry as usual).

    ``history``: failure records by attempt. ``failed_ranks``: how many ranks Ray reports
    as failed at ``attempt``; fewer records than that means a worker died (no loop).
    ``retries``: identical failures tolerated before the loop is declared. ``deaths``:
    attempts in which a worker is known to have died (killed by rayguard's watchdog, an
    injected kill): none of them is a loop.
    """
    current = list(history.get(attempt, ()))
    if not current or len(current) < failed_ranks or attempt in deaths:
        return None
    for record in current:
        if is_collateral(record):
            continue
        repeats, later = 0, record
        for earlier_attempt in range(attempt - 1, attempt - 1 - retries, -1):
            earlier = next((r for r in history.get(earlier_attempt, ())
                            if r.signature == later.signature), None)
            if earlier is None or not _same_failure(earlier, later):
                break
            repeats, later = repeats + 1, earlier
        if repeats >= retries:
            return record
    return None
