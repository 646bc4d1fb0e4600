"""``rayguard report RUN_DIR`` without ``-o`` writes into the run directory, not into the
current directory (the quickstart's command dropped report.html into the checkout)."""

from __future__ import annotations

import json

from rayguard.cli import main
from rayguard.observe.cli import REPORT_NAME, default_output


def test_the_default_is_the_run_directory_or_the_current_one_for_a_remote_run(tmp_path):
    assert default_output(str(tmp_path)) == str(tmp_path / REPORT_NAME)
    log = tmp_path / "rayguard_events.jsonl"
    assert default_output(str(log)) == str(tmp_path / REPORT_NAME)
    assert default_output(f"file://{tmp_path}") == str(tmp_path / REPORT_NAME)
    assert default_output("s3://bucket/run") == REPORT_NAME


def test_report_without_o_writes_beside_the_log(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    events = [{"kind": "start", "time": 1.0, "attempt": 0},
              {"kind": "finished", "time": 5.0, "attempt": 0}]
    (run / "rayguard_events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    elsewhere = tmp_path / "checkout"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["report", str(run)]) == 0
    assert (run / REPORT_NAME).is_file() and not list(elsewhere.iterdir())
    assert str(run / REPORT_NAME) in capsys.readouterr().out


def test_a_healthy_runs_report_says_none_and_has_no_empty_header(tmp_path):
    from rayguard.observe.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    events = [{"kind": "start", "time": 1.0, "attempt": 0},
              {"kind": "attempt_started", "time": 2.0, "attempt": 0, "world_size": 2},
              {"kind": "finished", "time": 5.0, "attempt": 0}]
    (run / "rayguard_events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    page = (tmp_path / "r.html")
    write_report(str(run), str(page))
    text = page.read_text()
    assert "none: no attempt failed" in text and "none: no fault" in text
    assert "<th></th>" not in text
