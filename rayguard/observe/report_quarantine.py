"""The report's quarantine section: which nodes the run left out, why, which were lifted and
where each entry came from. ``this run``: from the run's ``node_quarantined`` and
``quarantine_lifted`` events (so a remote run's uploaded log shows it too); ``file``: an
entry only the run directory's quarantine file names (an earlier run without a log, or
whoever else can write the directory; ``rayguard quarantine list`` reads the same file).

Every field read from an event is type-checked: a hostile log gives a row of ``None`` and
empty values, never an exception."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

from rayguard.events.fields import integer as _int
from rayguard.events.fields import number
from rayguard.health.quarantine_file import attempts as entry_attempts


def _time(value: Any) -> float | None:
    t = number(value)
    return t if t is not None and math.isfinite(t) else None


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _attempts(value: Any) -> list[int]:
    return [a for a in value if _int(a) is not None] if isinstance(value, list) else []


def quarantine_rows(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per quarantine, in order: node, reason, attempts counted, rank, when, detail,
    the attempt after which it was lifted (``None``: still in force at the log's end) and
    ``source`` (``"this run"``)."""
    rows: list[dict[str, Any]] = []
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("node"), str):
            continue
        if e.get("kind") == "node_quarantined":
            rows.append({"node": e["node"], "reason": _str(e.get("reason"), "?"),
                         "attempts": _attempts(e.get("attempts")), "rank": _int(e.get("rank")),
                         "time": _time(e.get("time")), "detail": _str(e.get("detail")),
                         "lifted_after": None, "source": "this run"})
        elif e.get("kind") == "quarantine_lifted":
            for row in rows:
                if row["node"] == e["node"] and row["lifted_after"] is None:
                    row["lifted_after"] = _int(e.get("attempt"))
    return rows


def file_rows(nodes: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for the quarantine file's entries (``nodes``, as
    :func:`rayguard.health.quarantine_file.read` returns them) that no row of the run's
    events holds in force: ``source`` ``"file"``."""
    in_force = {r["node"] for r in rows if r["lifted_after"] is None}
    out = []
    for node, entry in sorted(nodes.items()):
        if node in in_force or not isinstance(entry, dict):
            continue
        failures = entry.get("failures")
        last = failures[-1] if isinstance(failures, list) and failures else {}
        last = last if isinstance(last, dict) else {}
        out.append({"node": node, "reason": _str(entry.get("reason"), "?"),
                    "attempts": entry_attempts(entry), "rank": _int(last.get("rank")),
                    "time": _time(entry.get("time")), "detail": _str(last.get("detail")),
                    "lifted_after": None, "source": "file"})
    return out


def quarantine_section(rows: list[dict[str, Any]]) -> str:
    """``<h2>Quarantined nodes</h2>`` and its table (empty when nothing was quarantined)."""
    if not rows:
        return ""
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r["node"], r.get("source", "this run"), r["reason"],
            ", ".join(map(str, r["attempts"])), r["rank"],
            "in force" if r["lifted_after"] is None else f"lifted after attempt {r['lifted_after']}",
            r["detail"])) + "</tr>" for r in rows)
    head = "".join(f"<th>{h}</th>" for h in ("node", "source", "reason", "attempts", "rank",
                                               "state", "detail"))
    return ("<h2>Quarantined nodes</h2><table class='quarantine'><thead><tr>" + head
            + f"</tr></thead><tbody>{cells}</tbody></table>"
            + "<p class='muted'>source: <i>this run</i>, from the run's event log; <i>file</i>, "
              "named only by the run directory's quarantine file.</p>")
