"""``rayguard report``: one self-contained HTML file (plotly.js inlined: opens offline, no
server, no network) led by the run's goodput and a bar of its badput by cause
(:mod:`~rayguard.observe.report_goodput`), then its timeline, a metric over steps and a summary table; for a
sweep directory, one row per trial.

The data drawn is embedded as JSON in ``<script id="rayguard-report-data">``, so tests and
tools can read exactly what the page shows. Needs the ``report`` extra (plotly).
"""

from __future__ import annotations

import html
import json
import logging
import os
from typing import Any

from rayguard.checkpoint.interval_advice import recommend_interval
from rayguard.events.read import locate, read_log
from rayguard.events.record import json_safe
from rayguard.exceptions import RayGuardError
from rayguard.health import quarantine_file
from rayguard.observe.digest import digest_log
from rayguard.observe.goodput import goodput
from rayguard.observe.goodput_table import counted, noun
from rayguard.observe.report_goodput import STYLE as GOODPUT_STYLE
from rayguard.observe.report_goodput import goodput_section, replay_in_optimizer_steps
from rayguard.observe.report_quarantine import file_rows, quarantine_rows, quarantine_section
from rayguard.observe.timeline import build_run_digest, build_sweep

logger = logging.getLogger("rayguard")

DATA_ELEMENT_ID = "rayguard-report-data"
TIMELINE_ELEMENT_ID = "rayguard-timeline"
METRIC_ELEMENT_ID = "rayguard-metric"

_STATUS_STYLE = {"committed": ("circle", "#2ca02c"), "rejected": ("x", "#d62728"),
                 "fallback": ("diamond", "#ff7f0e"), "restored": ("triangle-up", "#1f77b4")}
_FAULT_STYLE = {"died": ("x", "#d62728"), "hang": ("hourglass", "#9467bd"),
                "nan": ("star", "#e377c2"), "straggler": ("triangle-down", "#8c564b"),
                "preflight": ("square", "#7f7f7f"), "crash_loop": ("bowtie", "#d62728"),
                "injected": ("circle-open", "#7f7f7f")}
_ATTEMPT_COLORS = ("#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9")


class ReportDependencyError(RayGuardError):
    """The plotting library of ``rayguard report`` is not installed."""


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as exc:
        raise ReportDependencyError(
            f"rayguard report draws with plotly, which is not installed ({exc}). Fix: "
            "pip install 'rayguard[report]' (or: pip install plotly)") from None
    return go, make_subplots


def write_report(run_dir: str, output: str = "report.html", *, metric: str | None = None,
                 filesystem: Any = None) -> str:
    """Read the log of ``run_dir`` (run or sweep; local path or URI), write the HTML file and
    return its path."""
    _plotly()  # fail before reading a large log
    source = locate(run_dir, filesystem)
    if source.kind == "sweep":
        parsed = read_log(source)
        data, bad_lines = build_sweep(parsed.events), parsed.bad_lines
    else:
        # streamed into a digest: memory bounded by what the page shows, not the log's length
        digest = digest_log(source, metric)
        events = digest.events()
        data, bad_lines = build_run_digest(digest, metric), digest.bad_lines
        data["goodput"] = goodput(digest.compact.events()).to_dict()
        data["goodput"]["checkpoint_interval"] = recommend_interval(events).line()
        replay_in_optimizer_steps(data)  # a loop reporting every N optimizer steps
        rows = quarantine_rows(events)
        data["quarantine"] = rows + file_rows(_quarantine_file(source), rows)
    data["source"] = str(run_dir)
    data["bad_lines"] = bad_lines
    page = render(data)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        f.write(page)
    return output


def _quarantine_file(source: Any) -> dict[str, Any]:
    """The entries of a local run's quarantine file (none for a remote run or a file that
    is not one: a warning says which)."""
    if source.filesystem is not None:
        return {}
    path = quarantine_file.quarantine_path(os.path.dirname(os.path.abspath(source.path)))
    try:
        return quarantine_file.read(path)["nodes"]
    except (OSError, ValueError) as exc:
        logger.warning("rayguard report: quarantine file left out: %s", exc)
        return {}


# -- figures ---------------------------------------------------------------------------------
def timeline_figure(data: dict[str, Any]) -> Any:
    go, make_subplots = _plotly()
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.56, 0.18, 0.26],
                        subplot_titles=("what happened", "world size", "steps/s"))
    lanes = ["restarts", "faults", "checkpoints", "attempts"]
    bands = []  # plain layout shapes: add_vrect(row="all") is slow with many attempts
    attempts = data["attempts"]
    for a in attempts:
        bands += _band(a["start"], a["end"], _ATTEMPT_COLORS[a["attempt"] % len(_ATTEMPT_COLORS)],
                       0.35)
    if attempts:  # one trace for every attempt: a trace each is slow past a few dozen
        fig.add_trace(go.Bar(
            x=[max(a["end"] - a["start"], 1e-3) for a in attempts],
            base=[a["start"] for a in attempts], y=["attempts"] * len(attempts),
            orientation="h", marker_line_color="#555", marker_line_width=1, showlegend=False,
            marker_color=[_ATTEMPT_COLORS[a["attempt"] % len(_ATTEMPT_COLORS)] for a in attempts],
            name="attempts", text=[f"attempt {a['attempt']}" for a in attempts],
            textposition="inside",
            customdata=[[a["attempt"], a["outcome"], a["world_size"], a["end"]] for a in attempts],
            hovertemplate=("attempt %{customdata[0]}: %{customdata[1]}, %{customdata[2]} "
                           "worker(s)<br>%{base:.1f} s .. %{customdata[3]:.1f} s<extra></extra>")),
            row=1, col=1)
    for status, (symbol, color) in _STATUS_STYLE.items():
        marks = [c for c in data["checkpoints"] if c["status"] == status]
        if marks:
            fig.add_trace(go.Scatter(
                x=[c["time"] for c in marks], y=["checkpoints"] * len(marks), mode="markers",
                marker={"symbol": symbol, "size": 11, "color": color}, name=f"checkpoint {status}",
                text=[f"{status} step {c['step']}: {html.escape(c['detail'])}" for c in marks],
                hovertemplate="%{text}<extra></extra>"), row=1, col=1)
    for kind, (symbol, color) in _FAULT_STYLE.items():
        marks = [f for f in data["faults"] if f["kind"] == kind]
        if marks:
            fig.add_trace(go.Scatter(
                x=[f["time"] for f in marks], y=["faults"] * len(marks), mode="markers",
                marker={"symbol": symbol, "size": 13, "color": color}, name=kind,
                text=[f"{kind} rank {f['rank']} step {f['step']}: {html.escape(f['detail'])}"
                      for f in marks], hovertemplate="%{text}<extra></extra>"), row=1, col=1)
    restarts = data["restarts"]
    for r in restarts:  # from the failure to the first step after the restart: time lost
        if r.get("resumed_time") is not None:
            bands += _band(r["failure_time"], r["resumed_time"], "#d62728", 0.08)
    if restarts:
        fig.add_trace(go.Scatter(
            x=[r["time"] for r in restarts], y=["restarts"] * len(restarts), mode="markers+text",
            marker={"symbol": "arrow-right", "size": 14, "color": "#000"}, name="restart",
            text=[_restart_label(r) for r in restarts], textposition="top center",
            hovertemplate="%{text}<extra></extra>"), row=1, col=1)
    ws = data["world_size"]
    if ws:
        end = data["summary"].get("wall_s", ws[-1][0])
        fig.add_trace(go.Scatter(x=[p[0] for p in ws] + [end], y=[p[1] for p in ws] + [ws[-1][1]],
                                 mode="lines", line_shape="hv", name="world size",
                                 showlegend=False), row=2, col=1)
    for name, xs, ys in _by_attempt(data["throughput"]):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"steps/s {name}",
                                 showlegend=False), row=3, col=1)
    fig.update_layout(shapes=bands)
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, row=1, col=1)
    fig.update_xaxes(title_text="seconds since start", row=3, col=1)
    fig.update_layout(height=620, margin={"l": 90, "r": 20, "t": 40, "b": 40},
                      legend={"orientation": "h", "y": -0.12}, barmode="overlay")
    return fig


def _band(x0: float, x1: float, color: str, opacity: float) -> list[dict[str, Any]]:
    """One vertical band over the three plot areas (not the titles between them)."""
    return [{"type": "rect", "xref": "x", "yref": f"{axis} domain", "x0": x0, "x1": x1, "y0": 0,
             "y1": 1, "fillcolor": color, "opacity": opacity, "line": {"width": 0},
             "layer": "below"} for axis in ("y", "y2", "y3")]


MAX_TRACES = 10
"""Curves per plot: past it, attempts share a trace (each attempt's curve still apart,
broken by a gap), as many traces each take time to build."""


def _by_attempt(points: list[dict[str, Any]], *, x: str = "time",
                y: str = "steps_per_s") -> list[tuple[str, list[Any], list[Any]]]:
    """``(name, xs, ys)`` per curve: one per attempt, or, with more than
    :data:`MAX_TRACES` attempts, attempts ``a`` with the same ``a % MAX_TRACES`` in one,
    each attempt's points apart (``None`` between two attempts: a gap)."""
    per: dict[int, list[dict[str, Any]]] = {}
    for p in points:
        per.setdefault(p["attempt"], []).append(p)
    shared = len(per) > MAX_TRACES
    out: dict[int, tuple[list[int], list[Any], list[Any]]] = {}
    for a in sorted(per):
        names, xs, ys = out.setdefault(a % MAX_TRACES if shared else a, ([], [], []))
        if xs:
            xs.append(None)
            ys.append(None)
        names.append(a)
        xs += [p[x] for p in per[a]]
        ys += [p[y] for p in per[a]]
    return [((f"attempt {names[0]}" if len(names) == 1
              else f"attempts {names[0]}, {names[1]}, ... (every {MAX_TRACES}th)"), xs, ys)
            for names, xs, ys in out.values()]


def _restart_label(r: dict[str, Any]) -> str:
    cost = f", {r['cost_s']:.1f} s" if r.get("cost_s") is not None else ""
    back = f", back to step {r['restored_step']}" if r.get("restored_step") is not None else ""
    return html.escape(f"{r['cause']}{cost}{back}")


def metric_figure(data: dict[str, Any]) -> Any:
    go, _ = _plotly()
    fig = go.Figure()
    metric = data["metric"]
    points = [{"attempt": s["attempt"], "x": p[0], "y": p[1]} for s in metric["series"]
              for p in s["points"]]
    for name, xs, ys in _by_attempt(points, x="x", y="y"):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", marker={"size": 4}, name=name))
    lines, notes = [], []  # one layout update: add_vline each is quadratic in the restarts
    for r in data["restarts"]:
        if r.get("restored_step") is not None:
            lines.append({"type": "line", "xref": "x", "yref": "y domain", "x0": r["restored_step"],
                          "x1": r["restored_step"], "y0": 0, "y1": 1,
                          "line": {"dash": "dash", "color": "#d62728"}})
            notes.append({"xref": "x", "yref": "y domain", "x": r["restored_step"], "y": 1,
                          "xanchor": "right", "yanchor": "top", "showarrow": False,
                          "text": html.escape(f"restart ({r['cause']}): back to step "
                                              f"{r['restored_step']}, "
                                              f"{counted(r['replayed_steps'], _unit(data, 'replay_unit'))} "
                                              "replayed")})
    fig.update_layout(shapes=lines, annotations=notes)
    fig.update_layout(height=360, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      xaxis_title="step", yaxis_title=html.escape(str(metric["name"])))
    return fig


# -- page -----------------------------------------------------------------------------------
def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _unit(data: dict[str, Any], field: str = "step_unit") -> str:
    """What the run's steps count (the goodput's ``step_unit``: ``"epoch"``, else steps), or
    its replay (``replay_unit``: optimizer steps for a loop that reports rarer)."""
    g = data.get("goodput") or {}
    return str(g.get(field) or g.get("step_unit") or "step")


def summary_rows(s: dict[str, Any], unit: str = "step") -> list[tuple[str, str]]:
    causes = ", ".join(f"{k}: {v}" for k, v in sorted(s.get("restarts_by_cause", {}).items()))
    return [
        ("outcome", str(s.get("outcome"))),
        ("wall time", f"{s.get('wall_s', 0):.1f} s"),
        ("attempts", str(s.get("attempts"))),
        ("restarts", f"{s.get('restarts')}" + (f" ({causes})" if causes else "")),
        ("time lost to failures", f"{s.get('time_lost_s', 0):.1f} s (detection + restart + "
         f"{counted(s.get('replayed_steps', 0), unit)} replayed x "
         f"{s.get('mean_step_s', 0) * 1e3:.1f} ms)"),
        ("checkpoints committed", str(s.get("checkpoints_committed"))),
        ("checkpoint blocked time", f"{s.get('checkpoint_blocked_s', 0):.2f} s (back-pressure "
         f"{s.get('checkpoint_backpressure_s', 0):.2f} s)"),
        ("checkpoint size (total)", _fmt_bytes(s.get("checkpoint_bytes", 0))),
        ("checkpoints rejected / fallbacks", f"{s.get('checkpoints_rejected')} / {s.get('fallbacks')}"),
        ("stalls / NaN events / stragglers",
         f"{s.get('stalls')} / {s.get('nan_events')} / {s.get('stragglers')}"),
    ]


def _table(headers: list[str], rows: list[list[str]], cls: str, *,
           none: str = "none") -> str:
    """An HTML table; no rows: ``none`` as a paragraph (not a header over nothing); headers
    all empty: no header row."""
    if not rows:
        return f'<p class="{cls} none">{html.escape(none)}</p>'
    if not any(headers):
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
        return f'<table class="{cls}"><tbody>{body}</tbody></table>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _restart_table(data: dict[str, Any]) -> str:
    rows = []
    for r in data["restarts"]:
        rows.append([str(r["attempt"]), html.escape(str(r["cause"])), f"{r['failure_time']:.1f} s",
                     "-" if r["cost_s"] is None else f"{r['cost_s']:.1f} s",
                     f"{r['detection_s']:.1f} s", str(r["restored_step"]), str(r["replayed_steps"]),
                     "yes" if r["fallback"] else "no"])
    return _table(["failed attempt", "cause", "at", "cost (failure to first step)", "detection",
                   f"resumed from {noun(_unit(data))}", f"replayed {noun(_unit(data, 'replay_unit'))}s",
                   "fallback"], rows,
                  "restarts",
                  none="none: no attempt failed")


def _fault_table(data: dict[str, Any]) -> str:
    rows = []
    for f in data["faults"]:
        detail = html.escape(f["detail"])
        stacks = f.get("stacks")
        for name, path in (sorted(stacks.items()) if isinstance(stacks, dict)
                           else [("", stacks)] if stacks else []):
            link = html.escape("file://" + os.path.abspath(str(path)))
            label = f"rank {html.escape(name)} stacks" if name else "stack dump"
            detail += f' <a class="stacks" href="{link}">{label}</a>'
        rows.append([f"{f['time']:.1f} s", str(f["attempt"]), str(f["rank"]),
                     html.escape(f["kind"]), str(f["step"]), detail])
    return _table(["at", "attempt", "rank", "fault", "step", "detail"], rows, "faults",
                  none="none: no fault, stall, NaN or rejected checkpoint")


_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:13px}th{background:#f3f3f3}h1{font-size:22px}h2{font-size:17px}
.muted{color:#777;font-size:12px}"""

_PROBE = """<script>
window.__rayguardErrors = [];
window.addEventListener("error", function (e) { window.__rayguardErrors.push(String(e.message)); });
window.addEventListener("load", function () {
  var el = document.getElementById("%s");
  var box = el ? el.getBoundingClientRect() : {width: 0, height: 0};
  document.body.setAttribute("data-timeline-size", Math.round(box.width) + "x" + Math.round(box.height));
  document.body.setAttribute("data-script-errors", String(window.__rayguardErrors.length));
  document.body.setAttribute("data-plotly", typeof Plotly === "undefined" ? "missing" : "loaded");
});
</script>"""


def render(data: dict[str, Any]) -> str:
    """The whole page (plotly.js inlined once)."""
    payload = data_json(data)
    title = "rayguard sweep report" if data["kind"] == "sweep" else "rayguard run report"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>",
             f"<style>{_STYLE}\n{GOODPUT_STYLE}</style>", _PROBE % TIMELINE_ELEMENT_ID, "</head><body>",
             f"<h1>{title}</h1><p class='muted'>{html.escape(str(data.get('source', '')))}</p>"]
    if data["kind"] == "sweep":
        parts.append(_sweep_body(data))
    elif data.get("empty"):
        parts.append("<p>The event log is empty.</p>")
    else:
        parts.append(_run_body(data))
    parts.append(f'<script type="application/json" id="{DATA_ELEMENT_ID}">{payload}</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_body(data: dict[str, Any]) -> str:
    timeline = timeline_figure(data).to_html(full_html=False, include_plotlyjs=True,
                                             div_id=TIMELINE_ELEMENT_ID)
    metric = metric_figure(data).to_html(full_html=False, include_plotlyjs=False,
                                         div_id=METRIC_ELEMENT_ID)
    summary = _table(["", ""], [[html.escape(k), html.escape(v)]
                                for k, v in summary_rows(data["summary"], _unit(data, "replay_unit"))],
                     "summary")
    return "\n".join([
        goodput_section(data.get("goodput")) if "goodput" in data else "",
        "<h2>Summary</h2>", summary, "<h2>Timeline</h2>", timeline,
        "<h2>Restarts</h2>", _restart_table(data), "<h2>Faults</h2>", _fault_table(data),
        quarantine_section(data.get("quarantine") or []),
        f"<h2>{html.escape(str(data['metric']['name']))} over steps</h2>", metric,
        "<p class='muted'>Sampled from each rank's step summaries (lowest rank per attempt); "
        "a restart that went back to a checkpoint shows the replayed steps twice.</p>"])


def _sweep_body(data: dict[str, Any]) -> str:
    go, _ = _plotly()
    rows = []
    for t in data["trials"]:
        verdicts = "; ".join(html.escape(f"{v['check']}: {v['detail']}") for v in t["verdicts"])
        rows.append([html.escape(t["trial_id"]), html.escape(t["state"]), str(t["restarts"]),
                     verdicts or "healthy"])
    fig = go.Figure(go.Bar(x=[html.escape(t["trial_id"]) for t in data["trials"]],
                           y=[t["restarts"] for t in data["trials"]], name="restarts"))
    fig.update_layout(height=300, yaxis_title="health restarts", margin={"t": 20})
    chart = fig.to_html(full_html=False, include_plotlyjs=True, div_id=TIMELINE_ELEMENT_ID)
    return "\n".join([f"<p>{len(data['trials'])} trial(s), {data['wall_s']:.1f} s</p>",
                      _table(["trial", "state", "restarts", "health verdicts"], rows, "trials"),
                      chart])


def data_json(data: dict[str, Any]) -> str:
    """The data as JSON that cannot end or change the ``<script>`` element holding it:
    every ``<``, ``>`` and ``&`` is a ``\\u`` escape (a detail holding ``</script>`` or
    ``<!--<script>`` stays text); non-finite numbers become strings."""
    text = json.dumps(json_safe(data), default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def embedded_data(page: str) -> dict[str, Any]:
    """The JSON a report page embeds (for tests and tools)."""
    start = page.index(f'id="{DATA_ELEMENT_ID}">') + len(f'id="{DATA_ELEMENT_ID}">')
    end = page.index("</script>", start)
    return json.loads(page[start:end].replace("<\\/", "</"))
