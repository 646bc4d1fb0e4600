"""The report's quarantine section: which nodes the run left out, why, and which were lifted,
from the run's ``node_quarantined`` and ``quarantine_lifted`` events (so a remote run's
uploaded log shows it too; ``rayguard quarantine list`` reads the run directory's file)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any


def quarantine_rows(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per quarantine, in order: node, reason, attempts counted, rank, when, detail,
    and the attempt after which it was lifted (``None``: still in force at the log's end)."""
    rows: list[dict[str, Any]] = []
    for e in events:
        if e.get("kind") == "node_quarantined":
            rows.append({"node": str(e.get("node")), "reason": str(e.get("reason")),
                         "attempts": list(e.get("attempts") or []), "rank": e.get("rank"),
                         "time": e.get("time"), "detail": str(e.get("detail", "")),
                         "lifted_after": None})
        elif e.get("kind") == "quarantine_lifted":
            for row in rows:
                if row["node"] == str(e.get("node")) and row["lifted_after"] is None:
                    row["lifted_after"] = e.get("attempt")
    return rows


def quarantine_section(rows: list[dict[str, Any]]) -> str:
    """``<h2>Quarantined nodes</h2>`` and its table (empty when nothing was quarantined)."""
    if not rows:
        return ""
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r["node"], r["reason"], ", ".join(map(str, r["attempts"])), r["rank"],
            "in force" if r["lifted_after"] is None else f"lifted after attempt {r['lifted_after']}",
            r["detail"])) + "</tr>" for r in rows)
    head = "".join(f"<th>{h}</th>" for h in ("node", "reason", "attempts", "rank", "state",
                                               "detail"))
    return ("<h2>Quarantined nodes</h2><table class='quarantine'><thead><tr>" + head
            + f"</tr></thead><tbody>{cells}</tbody></table>")
