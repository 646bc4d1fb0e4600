"""Reading event logs tolerantly, the table, and the `rayguard events` command (no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rayguard.cli import main
from rayguard.events.read import follow, locate, parse_lines, read_log
from rayguard.observe.table import Filter, format_event, one_line


def _write(path, events, extra_lines=()):
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


RUN = [
    {"time": 100.0, "kind": "start", "rank": None, "node": None, "step": None, "attempt": 0,
     "detail": "fit() started"},
    {"time": 101.5, "kind": "worker_died", "rank": 1, "node": "abcdef0123456789", "step": None,
     "attempt": 0, "detail": "rank 1 failed: ActorDiedError\nsecond line", "details": "long"},
    {"time": 102.0, "kind": "restart", "rank": None, "node": None, "step": None, "attempt": 0,
     "detail": "worker group restarts", "cause": "kill"},
    {"time": 103.0, "kind": "crash_loop", "rank": 0, "attempt": 1, "detail": "a kind from a newer "
     "rayguard", "brand_new_field": [1, 2]},
]


def test_unknown_kinds_extra_fields_and_broken_lines_are_tolerated(tmp_path):
    _write(tmp_path / "rayguard_events.jsonl", RUN, extra_lines=['{"time": 104, "kin', "[1, 2]"])
    parsed = read_log(locate(str(tmp_path)))
    assert [e["kind"] for e in parsed.events] == ["start", "worker_died", "restart", "crash_loop"]
    assert parsed.bad_lines == 2
    assert parsed.events[3]["brand_new_field"] == [1, 2]


def test_missing_log_names_both_files_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="rayguard_sweep_events.jsonl.*Fix"):
        locate(str(tmp_path))


def test_sweep_events_are_normalized(tmp_path):
    _write(tmp_path / "rayguard_sweep_events.jsonl", [
        {"time": 1.0, "kind": "unhealthy", "trial_id": "t1", "detail": "diverged",
         "data": {"verdict": {"check": "divergence"}}}])
    source = locate(str(tmp_path))
    assert source.kind == "sweep"
    event = read_log(source).events[0]
    assert event["trial_id"] == "t1" and event["verdict"] == {"check": "divergence"}


def test_table_row_is_one_line_with_time_since_start():
    line = format_event(RUN[1], t0=100.0)
    assert "\n" not in line and "1.50s" in line and "worker_died" in line
    assert "abcdef01" in line and "abcdef0123" not in line  # node shortened
    assert one_line("x" * 500, 20) == "x" * 17 + "..."


def test_filter_by_kind_and_rank_keeps_group_events():
    keep = Filter(kinds=(), rank=0)
    assert keep.keep(RUN[2])          # restart concerns every rank
    assert not keep.keep(RUN[1])      # rank 1
    assert Filter(kinds=("restart",)).keep(RUN[2]) and not Filter(kinds=("restart",)).keep(RUN[1])


def test_cli_events_table_json_and_filters(tmp_path, capsys):
    _write(tmp_path / "rayguard_events.jsonl", RUN)
    assert main(["events", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["+time", "attempt", "rank"] and len(out) == 5
    assert main(["events", str(tmp_path), "--json", "--kind", "restart"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["cause"] for r in rows] == ["kill"]
    assert main(["events", str(tmp_path), "--rank", "1", "--json"]) == 0
    kinds = [json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()]
    assert kinds == ["start", "worker_died", "restart"]
    assert main(["events", str(tmp_path / "nothing-here")]) == 2


def test_python_m_rayguard_events_prints_the_table(tmp_path):
    _write(tmp_path / "rayguard_events.jsonl", RUN)
    proc = subprocess.run([sys.executable, "-m", "rayguard.events", str(tmp_path), "--kind",
                           "worker_died"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "worker_died" in proc.stdout and "restart" not in proc.stdout


def test_follow_yields_new_whole_lines_only(tmp_path):
    path = tmp_path / "rayguard_events.jsonl"
    _write(path, RUN[:1])
    polls = {"n": 0}

    def stop():
        polls["n"] += 1
        if polls["n"] == 1:  # a writer appends one whole line and half of another
            with open(path, "a") as f:
                f.write(json.dumps(RUN[1]) + "\n" + json.dumps(RUN[2])[:20])
        elif polls["n"] == 2:
            with open(path, "a") as f:
                f.write(json.dumps(RUN[2])[20:] + "\n")
        return polls["n"] >= 3

    kinds = [e["kind"] for e in follow(locate(str(tmp_path)), poll_s=0.0, stop=stop)]
    assert kinds == ["start", "worker_died", "restart"]


def test_remote_filesystem_uri(tmp_path):
    _write(tmp_path / "rayguard_events.jsonl", RUN)
    source = locate(f"file://{tmp_path}")
    assert len(read_log(source).events) == 4
    import pyarrow.fs as pafs

    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    source = locate("", filesystem=fs)
    assert source.filesystem is fs and len(read_log(source).events) == 4


def test_parse_lines_sorts_by_time():
    text = "\n".join(json.dumps(e) for e in reversed(RUN))
    assert [e["time"] for e in parse_lines(text).events] == sorted(e["time"] for e in RUN)
