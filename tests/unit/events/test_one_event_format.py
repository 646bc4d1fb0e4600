"""Runs and sweeps write one record shape through one writer, and one reader reads both
(also sweep files written before, with a nested ``data``)."""

from __future__ import annotations

import json
import math

from rayguard import events as run_events
from rayguard.cli import main
from rayguard.events.read import locate, read_log
from rayguard.tune import events as ev


def test_a_sweep_record_has_the_run_shape_plus_trial_id(tmp_path):
    log = ev.SweepLog()
    log.attach(str(tmp_path))
    log.record(ev.UNHEALTHY, "t1", "loss=nan", verdict={"value": math.nan, "check": "nonfinite"})
    (line,) = (tmp_path / ev.EVENTS_FILE).read_text().splitlines()
    record = json.loads(line)  # strict JSON: the NaN is a string
    assert set(run_events.BASE_FIELDS) <= set(record)
    assert record["kind"] == "unhealthy" and record["trial_id"] == "t1"
    assert record["rank"] is None and record["verdict"] == {"value": "nan", "check": "nonfinite"}
    assert "data" not in record


def test_one_reader_gives_the_same_events_for_old_and_new_sweep_files(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    with open(old / ev.EVENTS_FILE, "w") as f:  # as rayguard wrote it before
        f.write(json.dumps({"time": 1.0, "kind": "restart", "trial_id": "t1", "detail": "again",
                            "data": {"checkpoint_iteration": 4, "check": "stall"}}) + "\n")
    log = ev.SweepLog()
    log.attach(str(new))
    log.extend([ev.SweepEvent(1.0, "restart", "t1", "again",
                              {"checkpoint_iteration": 4, "check": "stall"})])
    assert ev.read(old) == ev.read(new) == log.events()
    a, b = (read_log(locate(str(d))).events[0] for d in (old, new))
    assert {k: a[k] for k in ("kind", "trial_id", "checkpoint_iteration", "check")} == \
        {k: b[k] for k in ("kind", "trial_id", "checkpoint_iteration", "check")}


def test_a_data_field_named_like_a_base_field_is_kept(tmp_path):
    log = ev.SweepLog()
    log.attach(str(tmp_path))
    log.record(ev.SKIPPED, "t1", "x", step=3)
    (event,) = ev.read(tmp_path)
    assert event.data == {"data_step": 3}


def test_run_log_uses_the_same_writer_and_reader(tmp_path):
    path = run_events.events_path(tmp_path)
    run_events.EventLog(path).append(run_events.make_event("nan_detected", "bad", rank=0,
                                                          step=2, value=math.inf))
    with open(path, "a") as f:
        f.write('{"time": 9, "ki')  # a line cut short by a crash is skipped, not fatal
    (event,) = run_events.read(tmp_path)
    assert event["value"] == "inf" and event["rank"] == 0
    assert json.loads(path.read_text().splitlines()[0])["value"] == "inf"


def test_rayguard_events_prints_a_sweep_log(tmp_path, capsys):
    log = ev.SweepLog()
    log.attach(str(tmp_path))
    log.record(ev.TRIAL_STARTED, "t9", "trial t9 started", restarts=0)
    assert main(["events", str(tmp_path), "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert printed[-1]["trial_id"] == "t9" and printed[-1]["restarts"] == 0


def test_the_log_makes_its_directory_on_the_first_write_and_again_when_it_is_removed(tmp_path):
    import shutil

    from rayguard.events import EventLog, make_event

    path = tmp_path / "a" / "b" / "rayguard_events.jsonl"
    log = EventLog(path)
    log.append(make_event("start", "fit() started"))
    log.append(make_event("steps", "rank 0: steps 1..10"))
    shutil.rmtree(tmp_path / "a")  # a cleaner took the run directory while the run goes on
    log.append(make_event("restart", "attempt 1"))
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()] == ["restart"]
