"""Why a worker group restarted, from the events of the attempt that failed (pure).

Causes are :data:`rayguard.failures.CAUSES`: ``hang`` (a stall was detected), ``nan`` (a
watched metric was NaN/inf), ``preflight``, ``oom``, ``preemption`` (a node went away),
``kill`` (a worker process died: killed, segfault), ``error`` (an exception in the training
function), ``unknown`` (and the never-retried ``config``, ``setup``, ``checkpoint``).

Each ``worker_died`` event carries the cause the controller classified where the failure
happened (its ``failure`` field, :func:`rayguard.failures.classify`); an attempt reads as
the most severe. Events written by rayguard 0.1 have no such field: their cause is read
from the event's text (:mod:`rayguard.failures.patterns`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rayguard.failures import CAUSES, most_severe
from rayguard.failures.patterns import text_cause

__all__ = ["CAUSES", "FAILURE_KINDS", "failure_cause", "hang_culprits", "legacy_cause"]

FAILURE_KINDS = ("stall_detected", "nan_detected", "diverged", "preflight_error", "worker_died",
                 "crash_loop", "hang_diagnosed")

_BY_KIND = {"stall_detected": "hang", "nan_detected": "nan", "diverged": "nan",
            "preflight_error": "preflight",
            "hang_diagnosed": "hang"}


def _text(event: dict[str, Any]) -> str:
    parts = [event.get("detail"), event.get("details"), event.get("error")]
    return " ".join(str(p) for p in parts if p)


def legacy_cause(died: Iterable[dict[str, Any]]) -> str | None:
    """The cause of 0.1 ``worker_died`` events (no ``failure`` field), read from their text
    (``None``: no such event)."""
    texts = [_text(event) for event in died]
    return text_cause(" ".join(texts)) if texts else None


def failure_cause(events: Iterable[dict[str, Any]]) -> str:
    """The cause of the failure these events (one attempt's) describe."""
    causes: list[str] = []
    legacy: list[dict[str, Any]] = []
    for event in events:
        kind = event.get("kind")
        if kind in _BY_KIND:
            causes.append(_BY_KIND[str(kind)])
        elif kind == "worker_died":
            failure = event.get("failure")
            if isinstance(failure, str) and failure in CAUSES:
                causes.append(failure)
            else:
                legacy.append(event)
    old = legacy_cause(legacy)
    if old is not None:
        causes.append(old)
    return most_severe(causes)


def hang_culprits(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """What a restart says of a diagnosed hang among these events (one attempt's):
    ``{"culprits", "cause_detail"}`` from its ``hang_diagnosed`` event (``None``: none)."""
    for event in events:
        if event.get("kind") == "hang_diagnosed":
            return {"culprits": list(event.get("culprits") or []),
                    "cause_detail": str(event.get("detail") or "")}
    return None
