"""The report's quarantined nodes, from the run's events."""

from __future__ import annotations

import json

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


def test_event_fields_of_any_type_never_crash_the_rows() -> None:
    hostile = [
        {"kind": "node_quarantined", "node": "a" * 56, "attempts": 5, "rank": "r", "time": "t",
         "reason": ["x"], "detail": {"y": 1}},
        {"kind": "node_quarantined", "node": 7, "attempts": [0]},
        {"kind": "node_quarantined", "node": "b" * 56, "attempts": [0, "1", True, None, 2]},
        {"kind": "quarantine_lifted", "node": "b" * 56, "attempt": "later"},
        "not an event"]
    rows = quarantine_rows(hostile)
    assert [(r["attempts"], r["rank"], r["time"], r["reason"], r["detail"]) for r in rows] == [
        ([], None, None, "?", ""), ([0, 2], None, None, "?", "")]
    assert rows[1]["lifted_after"] is None and "Quarantined nodes" in quarantine_section(rows)


def _log(run_dir, *events) -> None:
    from rayguard.constants import EVENTS_FILENAME

    (run_dir / EVENTS_FILENAME).write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_report_survives_attempts_5(tmp_path) -> None:
    from rayguard.observe.report import embedded_data, write_report

    _log(tmp_path, make_event("start", "start"),
         make_event("node_quarantined", "q", node="a" * 56, reason="killed", attempts=5, rank=0))
    page = open(write_report(str(tmp_path), str(tmp_path / "r.html"))).read()
    rows = embedded_data(page)["quarantine"]
    assert [(r["node"], r["attempts"], r["source"]) for r in rows] == [("a" * 56, [], "this run")]


def test_the_report_marks_entries_only_the_file_names(tmp_path) -> None:
    from rayguard.health import quarantine_file
    from rayguard.observe.report import embedded_data, write_report

    a, b = "a" * 56, "b" * 56
    entry = {"reason": "oom", "time": 1.7e9,
             "failures": [{"attempt": 3, "rank": 1, "reason": "oom", "detail": "planted?"}]}
    quarantine_file.quarantine_path(tmp_path).write_text(
        json.dumps({"version": 1, "nodes": {a: entry, b: entry}, "lifted": {}}))
    _log(tmp_path, make_event("start", "start"),
         make_event("node_quarantined", "q", node=a, reason="killed", attempts=[0, 1], rank=0))
    page = open(write_report(str(tmp_path), str(tmp_path / "r.html"))).read()
    rows = embedded_data(page)["quarantine"]
    assert [(r["node"], r["source"], r["attempts"]) for r in rows] == [
        (a, "this run", [0, 1]), (b, "file", [3])]
    assert "<th>source</th>" in page
