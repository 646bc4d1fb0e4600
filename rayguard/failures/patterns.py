"""Text that names a kind of failure, in one place: Ray's death messages, out-of-memory and
preemption wording, and the gloo/NCCL errors a peer's death causes. The classifier reads an
exception's text with them."""

from __future__ import annotations

DIED = ("WorkerHealthCheckFailedError", "health check failed", "ActorDiedError", "actor died",
        "died unexpectedly", "SIGKILL", "exit code", "WorkerCrashedError",
        "ActorUnavailableError", "process died")
"""A worker process died (killed, segfault, the OOM killer)."""

OOM = ("outofmemoryerror", "out of memory", "running low on memory")
"""Out of memory. Not "OOM killer": Ray names it in every death message."""

PREEMPTED = ("preempt", "NodeDiedError", "node died", "node was removed", "spot")
"""The node went away."""

COLLATERAL_PATTERNS = (
    "connection reset by peer", "connection closed by peer", "broken pipe",
    "gloo/transport", "nccl error", "ncclremoteerror", "ncclsystemerror",
    "socket timeout", "connection refused", "watchdog caught collective",
    "peers lost", "synchronization barrier was reset",
)
"""Lower-case fragments of an error that follows a peer's death rather than a bug of its own
rank (the gloo and NCCL messages of a collective whose peer went away)."""

COLLATERAL_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "PeersLostError",
                    "SynchronizationBarrierResetError")
"""torch.distributed's error types for a broken process group, rayguard's released wait
(live recovery) and Ray's reset barrier."""


def text_cause(text: str) -> str:
    """``oom``, ``preemption``, ``kill`` (a death) or ``error``, from a failure's text."""
    lower = text.lower()
    if any(p in lower for p in OOM):
        return "oom"
    if any(p.lower() in lower for p in PREEMPTED):
        return "preemption"
    if any(p.lower() in lower for p in DIED):
        return "kill"
    return "error"


def reads_as_collateral(error_type: str, summary: str) -> bool:
    """Whether an error (qualified type, one-line summary) reads as the consequence of a
    peer's loss."""
    if error_type.endswith(COLLATERAL_TYPES):
        return True
    text = summary.lower()
    return any(p in text for p in COLLATERAL_PATTERNS)
