"""The lines of the final error ``fit()`` raises: one per worker, and a one-line summary."""

from __future__ import annotations


def worker_line(rank: int, error: BaseException, killed: dict[str, str] | None) -> str:
    """One worker's line of the final error; a worker rayguard's watchdog killed says so
    first (Ray's own text for a killed actor suggests the OOM killer)."""
    line = f"[rank {rank}] {type(error).__name__}: {error}"
    if not killed:
        return line
    return (f"[rank {rank}] killed by rayguard: {killed['bound']} bound ({killed['reason']}; "
            f"see the stall_detected event). Ray's view: {line.split(': ', 1)[-1][:300]}")


def one_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
