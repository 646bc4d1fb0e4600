"""The lines of the final error ``fit()`` raises: one per worker, and a one-line summary."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def worker_line(rank: int, error: BaseException, killed: dict[str, str] | None) -> str:
    """One worker's line of the final error; a worker rayguard's watchdog killed says so
    first (Ray's own text for a killed actor suggests the OOM killer)."""
    line = f"[rank {rank}] {type(error).__name__}: {error}"
    if not killed:
        return line
    return (f"[rank {rank}] killed by rayguard: {killed['bound']} bound ({killed['reason']}; "
            f"see the stall_detected event). Ray's view: {line.split(': ', 1)[-1][:300]}")


def final_lines(failures: Mapping[int, BaseException], records: Mapping[int, Any],
                kills: Mapping[int, dict[str, str]], stop_rank: int | None,
                is_mark: Callable[[BaseException], bool]) -> tuple[list[str], int]:
    """The final error's worker lines, and the rank whose exception becomes its cause.

    ``failures``: Ray's view, by rank; ``records``: the ranks' own failures in the last
    attempt (:class:`~rayguard.health.crash_loop.FailureRecord`); ``stop_rank``: the rank
    rayguard's verdict named. A rank whose error in Ray's view is rayguard's mark
    (``is_mark``: the controller failed it with the others before its own error reached
    Ray, or to restart the group) is shown by its own error where it recorded one; the
    cause is the verdict's rank unless its error there is a mark, then the lowest rank whose
    error is its own."""
    lines = []
    for rank, error in sorted(failures.items()):
        record = records.get(rank)
        if is_mark(error) and record is not None and not kills.get(rank):
            lines.append(f"[rank {rank}] {record.summary}")
        else:
            lines.append(worker_line(rank, error, kills.get(rank)))
    cause = stop_rank if stop_rank is not None and stop_rank in failures else min(failures)
    if is_mark(failures[cause]):
        cause = min((r for r, e in failures.items() if not is_mark(e)), default=cause)
    return lines, cause


def one_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
