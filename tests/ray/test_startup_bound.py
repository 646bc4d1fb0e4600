"""A slow start is not a stall: before a rank's first step only the start-up bound applies
(HealthConfig(startup_timeout_s)), a stall event names the bound that fired, and the run's
final error names rayguard's kill. The recovery after such a kill is the same as after any
hang (the live and restart hang tests); the decision itself is proved in milliseconds by
tests/unit/controller/test_harness_startup.py."""

from __future__ import annotations

import time

import pytest
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer


def stuck_start_loop(config):
    if rayguard.train.get_context().attempt == 0 and rayguard.train.get_context().rank == 0:
        time.sleep(600)  # never reaches its first step
    for step in range(3):
        rayguard.train.report({"loss": 1.0, "step": step})


def test_a_start_that_never_ends_is_caught_by_the_startup_bound(ray_local, tmp_path):
    """Rank 0 never reaches its first step: the start-up bound (not the stall bound) kills it,
    the events say which bound and why, and with no restart left ``fit()``'s error names
    rayguard's kill and the event to read (not a bare "worker died")."""
    guard = rayguard.GuardConfig(numa="off", health=rayguard.HealthConfig(
        stall_timeout_s=600.0, startup_timeout_s=4.0, max_restarts=0))
    trainer = make_trainer(stuck_start_loop, tmp_path, guard=guard, name="stuck-start")
    with pytest.raises(WorkerGroupError) as info:
        trainer.fit()
    message = str(info.value)
    assert "killed by rayguard: startup bound" in message, message
    assert "see the stall_detected event" in message
    events = read_events(trainer.run_dir)
    stalls = [e for e in events if e["kind"] == "stall_detected"]
    assert stalls and stalls[0]["bound"] == "startup" and stalls[0]["rank"] == 0
    assert "startup_timeout_s" in stalls[0]["detail"]
    died = [e for e in events if e["kind"] == "worker_died" and e["rank"] == 0]
    assert died and died[0]["failure"] == "hang", died
    assert "killed by rayguard: startup" in died[0]["detail"]
    assert "restart" not in [e["kind"] for e in events]
