"""Straggler detection on a real 2-worker run: a rank that sleeps 3x longer per step is
flagged within the window, and its balanced peer is not. That balanced runs are never
flagged is a decision of the straggler rule, proven over many simulated runs with jitter
(tests/unit/observe/test_straggler_balanced_runs.py): measured here, a balanced run's
step times differ by under 1% between ranks, far inside what those runs cover.

Every rank runs the same number of steps: Ray Train V2 pairs the i-th report of every rank,
so a rank that reported more often than its peers would wait for ever at the end."""

from __future__ import annotations

import time

import pytest

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer

STEP_S = 0.05
STEPS = 60           # the slow rank runs 9 s: the window and its summaries fit twice
WINDOW_S = 3.0
INTERVAL_S = 0.5


def sleepy_loop(config):
    ctx = rayguard.train.get_context()
    slow = config["slow_rank"]
    step_s = STEP_S * (3 if ctx.rank == slow else 1)
    for step in range(STEPS):
        time.sleep(step_s)
        rayguard.train.report({"loss": 1.0 / (step + 1), "step": step})


def _run(tmp_path, name, slow_rank):
    health = rayguard.HealthConfig(step_summary_interval_s=INTERVAL_S, straggler_window_s=WINDOW_S,
                                   straggler_threshold=1.5)
    guard = rayguard.GuardConfig(numa="off", preflight=False, health=health)
    result = make_trainer(sleepy_loop, tmp_path,
                          config={"slow_rank": slow_rank},
                          guard=guard, name=name).fit()
    return read_events(result.path)


def test_slow_rank_is_flagged_within_the_window(ray_local, tmp_path):
    events = _run(tmp_path, "straggler", slow_rank=1)
    flagged = [e for e in events if e["kind"] == "straggler"]
    assert [e["rank"] for e in flagged] == [1], [e["detail"] for e in flagged]
    v = flagged[0]
    assert v["ratio"] == pytest.approx(3.0, rel=0.35)
    assert v["node"] and "gpu_ids" in v and "rank 1" in v["detail"]
    first = min(e["time"] for e in events if e["kind"] == "steps" and e["rank"] == 1)
    # within the window: once rank 1 has been watched for a whole window (plus the summary
    # interval and scheduling slack on a loaded machine)
    assert v["time"] - first <= WINDOW_S + 4 * INTERVAL_S + 5.0
    scores = [e["straggler_score"] for e in events if e["kind"] == "steps" and e["rank"] == 0
              and e.get("straggler_score") is not None]
    assert scores and max(scores) < 1.0  # the fast rank is faster than its peer
