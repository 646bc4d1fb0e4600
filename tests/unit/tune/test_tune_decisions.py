"""The restart planner, event log and verify switch of rayguard.tune (pure, no Ray)."""

from __future__ import annotations

import pickle

import pytest

from rayguard import HealthConfig
from rayguard.health.checks import Point, Verdict
from rayguard.health.decisions import FAIL, RESTART, CheckpointRecord
from rayguard.tune import events as ev
from rayguard.tune.decisions import choose_checkpoint, decide, rewind
from rayguard.tune.verify import checkpoint_is_good

H = HealthConfig(max_restarts=2)
RECORDS = [CheckpointRecord(i, f"/c/{i}") for i in range(1, 6)]


def verdict(check="nonfinite", since=5):
    return Verdict("t", check, "loss", float("nan"), float("inf"), since, 0.0, "loss=nan")


def test_checkpoint_is_newest_before_the_anomaly_not_the_latest():
    assert choose_checkpoint(RECORDS, 5, lambda p: True).iteration == 4
    assert choose_checkpoint(RECORDS, 3, lambda p: True).iteration == 2
    assert choose_checkpoint(RECORDS, 99, lambda p: True).iteration == 5
    assert choose_checkpoint(RECORDS, 1, lambda p: True) is None


def test_checkpoint_skips_bad_ones():
    good = choose_checkpoint(RECORDS, 5, lambda p: p not in ("/c/4", "/c/3"))
    assert good.iteration == 2
    assert choose_checkpoint(RECORDS, 5, lambda p: False) is None


def test_decide_restart_then_fail_when_budget_spent():
    d = decide(verdict(), 0, H, RECORDS, lambda p: True)
    assert d.action == RESTART and d.checkpoint.iteration == 4 and d.restarts == 1
    assert "iteration 4" in d.reason and "1/2" in d.reason
    d = decide(verdict(), 2, H, RECORDS, lambda p: True)
    assert d.action == FAIL and d.checkpoint is None and "max_restarts=2" in d.reason


def test_decide_zero_budget_fails_at_once():
    d = decide(verdict("stall"), 0, HealthConfig(max_restarts=0), RECORDS, lambda p: True)
    assert d.action == FAIL


def test_decide_nan_policy_fail():
    d = decide(verdict(), 0, HealthConfig(nan_policy="fail"), RECORDS, lambda p: True)
    assert d.action == FAIL and "nan_policy='fail'" in d.reason
    d = decide(verdict("divergence"), 0, HealthConfig(nan_policy="fail"), RECORDS,
               lambda p: True)
    assert d.action == RESTART


def test_decide_restart_from_scratch_without_checkpoint():
    d = decide(verdict(since=1), 0, H, RECORDS, lambda p: True)
    assert d.action == RESTART and d.checkpoint is None and "scratch" in d.reason


def test_rewind_drops_what_came_after_the_checkpoint():
    points = [Point(i, float(i), {"loss": 1.0}) for i in range(1, 8)]
    kept, recs = rewind(points, RECORDS, RECORDS[2])
    assert [p.iteration for p in kept] == [1, 2, 3] and [r.iteration for r in recs] == [1, 2, 3]
    kept, recs = rewind(points, RECORDS, None)
    assert kept == [] and recs == []


def test_event_log_memory_file_and_pickle(tmp_path):
    log = ev.SweepLog()
    log.record(ev.SWEEP_STARTED, None, "go")
    log.attach(str(tmp_path))
    log.record(ev.UNHEALTHY, "t1", "nan", verdict={"value": float("nan")})
    log.record(ev.RESTART, "t1", "again", checkpoint_iteration=4)
    assert [e.kind for e in log.events(trial_id="t1")] == ["unhealthy", "restart"]
    assert len(log.events(kind="restart")) == 1
    on_disk = ev.read(tmp_path)
    assert [e.kind for e in on_disk] == ["sweep_started", "unhealthy", "restart"]
    assert on_disk[2].data["checkpoint_iteration"] == 4
    assert on_disk[1].data["verdict"]["value"] == "nan"
    clone = pickle.loads(pickle.dumps(log))
    assert len(clone) == 3
    clone.record(ev.FAILED, "t1", "x")  # the clone has its own lock and no file
    assert len(ev.read(tmp_path)) == 3


def test_event_log_attach_remote_is_memory_only():
    log = ev.SweepLog()
    log.attach("s3://bucket/exp")
    log.record(ev.SWEEP_STARTED, None, "go")
    assert len(log) == 1


def test_checkpoint_is_good(tmp_path, monkeypatch):
    assert checkpoint_is_good("s3://bucket/ckpt")
    assert not checkpoint_is_good(str(tmp_path / "missing"))
    (tmp_path / "state.json").write_text("{}")
    assert checkpoint_is_good(str(tmp_path))


@pytest.mark.parametrize("ok", [True, False])
def test_checkpoint_with_manifest_is_verified(tmp_path, monkeypatch, ok):
    import rayguard.checkpoint as ck

    class Report:
        def __init__(self, ok):
            self.ok = ok

    monkeypatch.setattr(ck, "verify", lambda d: Report(ok), raising=False)
    (tmp_path / "rayguard_manifest.json").write_text("{}")
    assert checkpoint_is_good(str(tmp_path)) is ok
