"""The one record shape of runs and sweeps.

One JSON object a line with at least ``time``, ``kind``, ``rank``, ``node``, ``step``,
``attempt`` and a human ``detail`` (``None`` where a field does not apply, e.g. ``rank`` in a
sweep, which adds ``trial_id``); other fields sit beside them. Non-finite floats are written
as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON, readable by ``jq``).
"""

from __future__ import annotations

import math
import time
from typing import Any

from rayguard.events.kinds import check_kind

BASE_FIELDS = ("time", "kind", "rank", "node", "step", "attempt", "detail")
"""The fields every record has (``None`` where they do not apply, e.g. ``rank`` in a sweep)."""


def make_event(kind: str, detail: str, *, rank: int | None = None, node: str | None = None,
               step: int | None = None, attempt: int | None = None, **extra: Any) -> dict[str, Any]:
    """Build one event record (``time`` is wall-clock seconds since the epoch); ``kind`` must
    be one of :data:`~rayguard.events.kinds.KINDS`."""
    check_kind(kind)
    event = {"time": time.time(), "kind": kind, "rank": rank, "node": node, "step": step,
             "attempt": attempt, "detail": detail}
    event.update(extra)
    return event


_PLAIN = frozenset((str, int, bool, type(None)))


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as strings (``"nan"``), recursively. The exact types
    that make up nearly every event are dispatched first (the coordinator writes hundreds of
    events a second at scale); any other value, a subclass too, goes the general way."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if kind is dict:
        return {(k if type(k) is str else str(k)): json_safe(v) for k, v in value.items()}
    if kind is list:
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
