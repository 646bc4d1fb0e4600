"""Why a worker group restarted, from the events of the attempt that failed (pure).

Causes are :data:`rayguard.failures.CAUSES`: ``hang`` (a stall was detected), ``nan`` (a
watched metric was NaN/inf), ``preflight``, ``oom``, ``preemption`` (a node went away),
``kill`` (a worker process died: killed, segfault), ``error`` (an exception in the training
function), ``unknown`` (and the never-retried ``config``, ``setup``, ``checkpoint``).

Each ``worker_died`` event carries the cause the controller classified where the failure
happened (its ``failure`` field, :func:`rayguard.failures.classify`); an attempt reads as
the most severe. An older log's ``worker_died`` that has only the old ``cause`` label
(``died``, ``stall``, ``injected kill``, ...) reads through :data:`_OLD_LABELS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rayguard.failures import CAUSES, most_severe

__all__ = ["CAUSES", "FAILURE_KINDS", "failure_cause", "hang_culprits"]

FAILURE_KINDS = ("stall_detected", "nan_detected", "diverged", "preflight_error", "worker_died",
                 "crash_loop", "hang_diagnosed")

_BY_KIND = {"stall_detected": "hang", "nan_detected": "nan", "diverged": "nan",
            "preflight_error": "preflight",
            "hang_diagnosed": "hang"}

_OLD_LABELS = {"died": "kill", "injected kill": "kill", "stall": "hang", "startup": "hang",
               "injected hang": "hang", "injected raise": "error", "injected nan": "nan"}
"""The old ``worker_died`` ``cause`` labels as causes (``nan``, ``error`` are causes already)."""


def failure_cause(events: Iterable[dict[str, Any]]) -> str:
    """The cause of the failure these events (one attempt's) describe."""
    causes: list[str] = []
    for event in events:
        kind = event.get("kind")
        if kind in _BY_KIND:
            causes.append(_BY_KIND[str(kind)])
        elif kind == "worker_died":
            old = str(event.get("cause"))  # an older log: only the old label
            causes.append(str(event.get("failure") or _OLD_LABELS.get(old, old)))
    return most_severe(causes)


def hang_culprits(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """What a restart says of a diagnosed hang among these events (one attempt's):
    ``{"culprits", "cause_detail"}`` from its ``hang_diagnosed`` event (``None``: none)."""
    for event in events:
        if event.get("kind") == "hang_diagnosed":
            return {"culprits": list(event.get("culprits") or []),
                    "cause_detail": str(event.get("detail") or "")}
    return None
