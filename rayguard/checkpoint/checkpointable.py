"""Whether a ``report(state=...)`` value can be checkpointed, checked before any peer waits.

A DTensor belongs in ``sharded=``; anything the checkpoint format cannot encode fails the
same way on every attempt. Both end the run at once (:class:`StateNotCheckpointableError`)
with the path of the offending value in the user's own state (``state['cfg']``).
"""

from __future__ import annotations

from typing import Any


def check_checkpointable(state: Any, rank: int) -> None:
    """Fail fast, before any peer waits for this rank, on a value no checkpoint can hold."""
    from rayguard.checkpoint.format import encode
    from rayguard.checkpoint.sharded import dtensor_error_message, find_distributed_tensors
    from rayguard.exceptions import SerializationError, StateNotCheckpointableError

    paths = find_distributed_tensors(state)
    if paths:
        raise StateNotCheckpointableError(dtensor_error_message(paths, rank))
    try:
        encode(state)
    except SerializationError as exc:
        raise StateNotCheckpointableError(
            f"rank {rank}: report(state=...): {exc}") from None
