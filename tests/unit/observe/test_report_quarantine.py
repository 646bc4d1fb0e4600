"""The report's quarantined nodes, from the run's events."""

from __future__ import annotations

from rayguard.events import make_event
from rayguard.observe.report_quarantine import quarantine_rows, quarantine_section


def test_rows_follow_quarantines_and_lifts() -> None:
    events = [
        make_event("worker_died", "rank 0 failed", rank=0, attempt=0),
        make_event("node_quarantined", "node a quarantined", node="a", reason="killed",
                   attempts=[0, 1], rank=0, attempt=1),
        make_event("node_quarantined", "node <b>", node="b", reason="straggler", attempts=[2],
                   rank=1, attempt=2),
        make_event("quarantine_lifted", "lifted", node="a", attempt=3),
    ]
    rows = quarantine_rows(events)
    assert [(r["node"], r["reason"], r["attempts"], r["lifted_after"]) for r in rows] == [
        ("a", "killed", [0, 1], 3), ("b", "straggler", [2], None)]
    page = quarantine_section(rows)
    assert "<h2>Quarantined nodes</h2>" in page and "lifted after attempt 3" in page
    assert "in force" in page and "&lt;b&gt;" in page and "<b>" not in page
    assert quarantine_section([]) == ""
