"""Rank 0's failure history at set-up: streamed from the run directory's log, parsing only the
lines it needs (start, restart, the first, the last and the event before each start), with
the same figures as from every event."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rayguard.checkpoint.interval_advice import failure_history
from rayguard.config import CheckpointConfig
from rayguard.events import append_events, read
from rayguard.events.read import run_source
from rayguard.train import pacing


def _log(steps: int) -> list[dict]:
    out = [{"kind": "start", "time": 1000.0, "detail": "fit() started"}]
    out += [{"kind": "steps", "time": 1000.0 + i, "attempt": 0, "rank": 0} for i in range(steps)]
    out += [{"kind": "worker_died", "time": 1000.0 + steps, "attempt": 0},
            {"kind": "restart", "time": 1000.5 + steps, "attempt": 0,
             "detail": "a restart after the start"},
            {"kind": "steps", "time": 1001.0 + steps, "attempt": 1, "rank": 0},
            {"kind": "finished", "time": 1002.0 + steps},
            {"kind": "start", "time": 50000.0}]  # the same directory, later
    out += [{"kind": "steps", "time": 50000.0 + i, "attempt": 0, "rank": 0} for i in range(steps)]
    out += [{"kind": "restart", "time": 50000.0 + steps, "attempt": 0}]
    return out


def test_the_streamed_history_equals_the_history_of_every_event(tmp_path: Path, monkeypatch):
    append_events(tmp_path / "rayguard_events.jsonl", _log(2000))
    read_mod = sys.modules["rayguard.events.read"]
    parsed = []
    real = read_mod.parse_line
    monkeypatch.setattr(read_mod, "parse_line",
                        lambda line, kind="run": parsed.append(line) or real(line, kind))
    streamed = failure_history(pacing.history_events(run_source(str(tmp_path))))
    assert len(parsed) < 12  # of some 4 000 lines
    monkeypatch.undo()
    whole = failure_history(read(str(tmp_path)))
    assert (streamed.failures, streamed.runs) == (whole.failures, whole.runs) == (2, 2)
    assert streamed.observed_s == pytest.approx(whole.observed_s) == pytest.approx(2002 + 2000)


def test_read_history_streams_and_still_never_raises(tmp_path: Path):
    append_events(tmp_path / "rayguard_events.jsonl", _log(10))
    history = pacing.read_history(str(tmp_path), None, attempt=0)
    assert history.failures == 2 and history.runs == 2
    assert pacing.read_history(str(tmp_path / "missing"), None, attempt=2).failures == 2


def test_the_history_carries_the_last_failure_and_the_checkpoint_costs(tmp_path: Path):
    log = _log(3)
    commits = [{"kind": "checkpoint_committed", "time": 1000.5 + i, "attempt": 0,
                "blocked_s": 0.1 * (i + 1)} for i in range(3)]
    commits.append({"kind": "checkpoint_committed", "time": 1004.0, "attempt": 1})  # Ray's
    append_events(tmp_path / "rayguard_events.jsonl", log[:2] + commits + log[2:])
    history = pacing.read_history(str(tmp_path), None, attempt=0)
    assert history.costs_s == pytest.approx((0.1, 0.2, 0.3))
    # the last failure: the second run's restart, at 3 s into it, after the first run's 5 s
    assert history.at_last_failure_s == pytest.approx(5 + 3)
    # this run's newest restart not in the log yet: the attempt started at a failure
    later = pacing.read_history(str(tmp_path), None, attempt=3)
    assert later.failures == 3 and later.at_last_failure_s == later.observed_s
    assert later.costs_s == history.costs_s
    ctx = type("Ctx", (), {"rank": 0, "run_dir": str(tmp_path), "attempt": 1})()
    policy = pacing.pacing_for(CheckpointConfig(interval=True), ctx).policy
    assert policy is not None and policy.cost_s == pytest.approx(0.2)
