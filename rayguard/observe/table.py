"""The event log as a readable table (``rayguard events``): time since start, attempt, rank,
node, step, kind and a one-line detail. Every cell is made inert (:mod:`rayguard.inert`):
a crafted detail cannot steer the terminal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rayguard.inert import inert

COLUMNS = ("+time", "attempt", "rank", "node", "step", "kind", "detail")
_NODE_CHARS = 8
_DETAIL_CHARS = 160


@dataclass(frozen=True)
class Filter:
    kinds: tuple[str, ...] = ()
    """Keep only these kinds (empty: all)."""
    rank: int | None = None
    """Keep only events of this rank (events with no rank, such as ``restart``, are kept:
    they concern every rank)."""

    def keep(self, event: dict[str, Any]) -> bool:
        if self.kinds and event.get("kind") not in self.kinds:
            return False
        if self.rank is not None:
            rank = event.get("rank")
            if rank is not None and rank != self.rank:
                return False
        return True


def one_line(text: Any, limit: int = _DETAIL_CHARS) -> str:
    """The first line of a detail, cut at ``limit`` characters."""
    if text is None:
        return ""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def row(event: dict[str, Any], t0: float) -> tuple[str, ...]:
    t = event.get("time")
    since = f"{float(t) - t0:9.2f}s" if isinstance(t, (int, float)) else "        ?"
    node = event.get("node")
    who = event.get("rank") if "trial_id" not in event else event.get("trial_id")
    return (since, _cell(event.get("attempt")), _cell(who),
            _cell(str(node)[:_NODE_CHARS] if node else None), _cell(event.get("step")),
            str(event.get("kind", "?")), _detail(event))


def _detail(event: dict[str, Any]) -> str:
    text = one_line(event.get("detail"))
    if event.get("kind") == "restart" and event.get("cause"):
        text += f" (cause: {event['cause']})"
    return text


def header(sweep: bool = False) -> str:
    cols = list(COLUMNS)
    if sweep:
        cols[2] = "trial"
    return _format(tuple(cols))


def _format(cells: tuple[str, ...]) -> str:
    widths = (10, 7, 6, _NODE_CHARS, 7, 20)
    safe = [inert(c) for c in cells]
    parts = [c.rjust(w) if i in (0, 1, 2, 4) else c.ljust(w)
             for i, (c, w) in enumerate(zip(safe[:-1], widths, strict=True))]
    return "  ".join(parts + [safe[-1]])


def format_event(event: dict[str, Any], t0: float, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(event, default=str, sort_keys=True)  # ASCII: escapes are inert
    return _format(row(event, t0))
