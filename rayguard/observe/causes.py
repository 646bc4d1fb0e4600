"""Why a worker group restarted, from the events of the attempt that failed (pure).

Causes: ``hang`` (a stall was detected), ``nan`` (a watched metric was NaN/inf),
``preflight``, ``oom``, ``preemption`` (a node went away), ``kill`` (a worker process died:
killed, segfault), ``error`` (an exception in the training function), ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CAUSES = ("hang", "nan", "preflight", "oom", "preemption", "kill", "error", "unknown")
FAILURE_KINDS = ("stall_detected", "nan_detected", "preflight_error", "worker_died", "crash_loop")

_DIED = ("WorkerHealthCheckFailedError", "health check failed", "ActorDiedError", "actor died", "died unexpectedly", "SIGKILL", "exit code",
         "WorkerCrashedError", "ActorUnavailableError", "process died")
_OOM = ("outofmemoryerror", "out of memory", "running low on memory")
_PREEMPT = ("preempt", "NodeDiedError", "node died", "node was removed", "spot")


def _text(event: dict[str, Any]) -> str:
    parts = [event.get("detail"), event.get("details"), event.get("error")]
    return " ".join(str(p) for p in parts if p)


def failure_cause(events: Iterable[dict[str, Any]]) -> str:
    """The cause of the failure these events (one attempt's) describe."""
    kinds: set[str] = set()
    died: list[str] = []
    for event in events:
        kind = event.get("kind")
        kinds.add(str(kind))
        if kind == "worker_died":
            died.append(_text(event))
    if "stall_detected" in kinds:
        return "hang"
    if "nan_detected" in kinds:
        return "nan"
    if "preflight_error" in kinds:
        return "preflight"
    text = " ".join(died)
    lower = text.lower()
    if any(p in lower for p in _OOM):  # not "OOM killer": Ray names it in every death message
        return "oom"
    if any(p.lower() in lower for p in _PREEMPT):
        return "preemption"
    if any(p.lower() in lower for p in _DIED):
        return "kill"
    return "error" if died else "unknown"
