"""The shipped Grafana dashboard is the generated one and names only real metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rayguard.observe.grafana import dashboard
from rayguard.observe.metrics import SPECS

SHIPPED = Path(__file__).resolve().parents[3] / "cluster-configs" / "grafana" / "rayguard.json"


def test_shipped_dashboard_is_up_to_date():
    assert json.loads(SHIPPED.read_text()) == dashboard(), (
        "regenerate: python -m rayguard.observe.grafana > cluster-configs/grafana/rayguard.json")


def test_every_query_names_an_exported_metric_and_every_metric_is_shown():
    exported = {s.exported for s in SPECS.values()}
    used = set()
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"ray_rayguard_[a-z_]+", target["expr"]):
                name = name.removesuffix("_bucket")
                assert name in exported, name
                used.add(name)
    assert used == exported
