"""The goodput section that leads ``rayguard report``: the ratio, a bar of the wall time by
cause (plain HTML, no script: it draws offline and in any viewer) and the table of causes."""

from __future__ import annotations

import html
from typing import Any

from rayguard.observe.goodput import CAUSES, RESTART_PHASES
from rayguard.observe.goodput_steps import OPTIMIZER_UNIT
from rayguard.observe.goodput_table import counted

COLORS = {"productive": "#2ca02c", "startup": "#9ecae1", "restart": "#d62728",
          "resize": "#e377c2",
          "replay": "#ff7f0e", "checkpoint": "#1f77b4", "stall": "#9467bd",
          "preemption": "#8c564b", "other": "#bbbbbb"}
"""One color per part of the bar (productive time and each cause)."""

BAR_ID = "rayguard-badput-bar"


def _parts(g: dict[str, Any]) -> list[tuple[str, float]]:
    badput = g.get("badput_s") or {}
    return [("productive", float(g.get("productive_s") or 0.0))] + [
        (c, float(badput.get(c) or 0.0)) for c in CAUSES]


def badput_bar(g: dict[str, Any]) -> str:
    """The wall time as one bar, a segment per cause (width = its share)."""
    wall = float(g.get("wall_s") or 0.0)
    if wall <= 0:
        return ""
    segments = []
    for name, seconds in _parts(g):
        if seconds <= 0:
            continue
        share = 100.0 * seconds / wall
        segments.append(f'<div class="seg seg-{name}" title="{name}: {seconds:.1f} s '
                        f'({share:.1f}%)" style="width:{share:.3f}%;background:{COLORS[name]}">'
                        "</div>")
    legend = " ".join(f'<span class="key"><i style="background:{COLORS[n]}"></i>{n} '
                      f"{s:.1f} s</span>" for n, s in _parts(g) if s > 0)
    return (f'<div id="{BAR_ID}" class="badput-bar">{"".join(segments)}</div>'
            f'<p class="legend">{legend}</p>')


def goodput_section(g: dict[str, Any] | None) -> str:
    """``<h2>Goodput</h2>``, the ratio, the bar, the table by cause, what was not measured."""
    if not g or g.get("ratio") is None:
        return "<h2>Goodput</h2><p>not measured (no events)</p>"
    wall = float(g["wall_s"])
    phases = g.get("restart_s") or {}
    rows = []
    for name, seconds in _parts(g):
        rows.append(f"<tr><td>{name}</td><td>{seconds:.2f} s</td>"
                    f"<td>{100.0 * seconds / wall if wall > 0 else 0.0:.1f}%</td></tr>")
        if name == "restart":
            rows += [f"<tr class='phase'><td>&nbsp;&nbsp;{p}</td>"
                     f"<td>{float(phases.get(p) or 0.0):.2f} s</td><td></td></tr>"
                     for p in RESTART_PHASES]
    table = ("<table class='goodput'><thead><tr><th>cause</th><th>time</th><th>share</th>"
             f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    notes = "".join(f"<li>{html.escape(str(n))}</li>" for n in g.get("not_measured") or ())
    return "\n".join([
        "<h2>Goodput</h2>",
        f"<p class='goodput-ratio'><b>goodput {float(g['ratio']):.2f}</b>: "
        f"{float(g['productive_s']):.1f} s of new steps in {wall:.1f} s of wall time, "
        f"{int(g.get('restarts') or 0)} restart(s), "
        f"{counted(int(g.get('replayed_steps') or 0), str(g.get('replay_unit') or 'step'))} "
        "replayed</p>",
        badput_bar(g), table,
        f"<p>{html.escape(str(g['checkpoint_interval']))}</p>" if g.get("checkpoint_interval")
        else "",
        f"<p class='muted'>Not measured:</p><ul class='muted'>{notes}</ul>" if notes else ""])


STYLE = """.badput-bar{display:flex;width:100%;max-width:900px;height:22px;border:1px solid #999}
.badput-bar .seg{height:100%}.legend .key{margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
tr.phase td{color:#555;font-size:12px}"""


def replay_in_optimizer_steps(data: dict[str, Any]) -> None:
    """The timeline's replay (``data``'s restarts and summary) in the goodput's optimizer
    steps, for a loop that reports rarer than it steps its optimizers: each restart's
    ``replayed_steps`` are the next attempt's; the summary's mean step spreads the replayed
    reports' time over their optimizer steps, so that the time lost stays the same."""
    g = data.get("goodput") or {}
    if g.get("replay_unit") != OPTIMIZER_UNIT:
        return
    by_attempt = {a["attempt"]: int(a["replayed_steps"]) for a in g.get("attempts") or []}
    for r in data.get("restarts") or []:
        if isinstance(r.get("attempt"), int):
            r["replayed_steps"] = by_attempt.get(r["attempt"] + 1, 0)
    summary = data.get("summary") or {}
    reports, optimizer_steps = summary.get("replayed_steps") or 0, int(g.get("replayed_steps") or 0)
    if summary and optimizer_steps:
        summary["mean_step_s"] = float(summary.get("mean_step_s") or 0.0) * reports / optimizer_steps
    if summary:
        summary["replayed_steps"] = optimizer_steps
