"""The Grafana dashboard for rayguard's metrics (``cluster-configs/grafana/rayguard.json``),
built from :data:`rayguard.observe.metrics.SPECS` so that it never names a metric that does
not exist. Regenerate the file with ``python -m rayguard.observe.grafana > FILE``."""

from __future__ import annotations

import json
from typing import Any

from rayguard.observe.metrics import SPECS

UID = "rayguard-run"
_SEL = '{run=~"$run"}'


def _exported(name: str) -> str:
    return SPECS[f"rayguard_{name}"].exported


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], x: int, y: int, *,
           unit: str = "short", w: int = 12, h: int = 8, kind: str = "timeseries",
           description: str = "") -> dict[str, Any]:
    return {
        "id": pid, "type": kind, "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(exprs)],
    }


def panels() -> list[dict[str, Any]]:
    m = _exported
    return [
        _panel(1, "World size", [(f"max by (run) ({m('world_size')}{_SEL})", "{{run}}")],
               0, 0, w=6, h=5, kind="stat"),
        _panel(2, "Attempt", [(f"max by (run) ({m('attempt')}{_SEL})", "{{run}}")],
               6, 0, w=6, h=5, kind="stat", description="0: never restarted"),
        _panel(3, "Restarts by cause", [(f"sum by (cause) ({m('restarts')}{_SEL})", "{{cause}}")],
               12, 0, w=12, h=5, kind="stat"),
        _panel(4, "Failures detected", [
            (f"sum({m('stalls')}{_SEL})", "stalls (hangs)"),
            (f"sum({m('nan_events')}{_SEL})", "NaN/inf"),
            (f"sum({m('stragglers')}{_SEL})", "stragglers flagged"),
            (f"max({m('quarantined_nodes')}{_SEL})", "nodes quarantined")], 0, 5),
        _panel(5, "Checkpoints", [
            (f"sum({m('checkpoints_committed')}{_SEL})", "committed"),
            (f"sum({m('checkpoints_rejected')}{_SEL})", "rejected"),
            (f"sum({m('checkpoint_fallbacks')}{_SEL})", "fallbacks")], 12, 5),
        _panel(6, "Checkpoint seconds (p50, p95)", [
            (f"histogram_quantile(0.5, sum by (le, phase) (rate({m('checkpoint_seconds')}_bucket"
             f"{_SEL}[$__rate_interval])))", "p50 {{phase}}"),
            (f"histogram_quantile(0.95, sum by (le, phase) (rate({m('checkpoint_seconds')}_bucket"
             f"{_SEL}[$__rate_interval])))", "p95 {{phase}}")], 0, 13, unit="s"),
        _panel(7, "Checkpoint bytes written per second",
               [(f"sum(rate({m('checkpoint_bytes')}{_SEL}[$__rate_interval]))", "bytes/s")],
               12, 13, unit="Bps"),
        _panel(8, "Step time per rank", [(f"{m('step_time_seconds')}{_SEL}", "rank {{rank}}")],
               0, 21, unit="s", description="mean wall time between reports, report excluded"),
        _panel(9, "Straggler score per rank",
               [(f"{m('straggler_score')}{_SEL}", "rank {{rank}}")], 12, 21,
               description="rank's mean step time / peers' median over the straggler window; "
                           "flagged at HealthConfig.straggler_threshold (default 1.5)"),
        _panel(10, "Report latency per rank",
               [(f"{m('report_latency_seconds')}{_SEL}", "rank {{rank}}")], 0, 29, unit="s",
               description="mean time a rayguard.train.report call blocked the loop"),
        _panel(11, "Goodput (ETTR)", [(f"min by (run) ({m('goodput_ratio')}{_SEL})", "{{run}}")],
               12, 29, w=4, h=8, kind="stat", unit="percentunit",
               description="productive time (new steps) / wall time of the run so far"),
        _panel(12, "Badput by cause", [
            (f"sum by (cause) ({m('badput_seconds')}{_SEL})", "{{cause}}")], 16, 29, w=8,
               unit="s", description="seconds not spent on new steps: startup, restart, "
                                     "replay, checkpoint, stall, preemption, other"),
    ]


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID, "title": "rayguard: training runs", "tags": ["rayguard", "ray"],
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Data source"},
            {"name": "run", "type": "query", "label": "Run", "includeAll": True, "multi": True,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": f"label_values({_exported('attempt')}, run)", "refresh": 2},
        ]},
        "panels": panels(),
    }


if __name__ == "__main__":
    print(json.dumps(dashboard(), indent=1))
