"""A straggler node is left out at the next resize of an elastic run.

Two worker nodes of one CPU each, ``ScalingConfig(num_workers=(1, 2))``. The worker on the
slow node takes 3x longer per step (its own sleep: no collective couples the ranks, so the
detector sees the real difference). With ``HealthConfig(straggler_evict_after_s=1)`` the
rank is flagged as a straggler, stays flagged, and its node is quarantined with reason
``straggler``; the elastic policy then counts only the other node and resizes to one
worker there, which finishes the run.

Every rank of one attempt reports the same number of times (Ray Train pairs the i-th report
of every rank), so the 2-worker attempt runs until it is resized, bounded by ``MAX_STEPS``.
"""

from __future__ import annotations

import json
import os

import pytest
from ray.train import FailureConfig, RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.cluster import SimulatedCluster

STEP_S = 0.05
MAX_STEPS = 1200  # a 2-worker attempt that is never resized ends here and fails the test


def _loop(config: dict) -> None:
    import time

    ctx = rayguard.train.get_context()
    slow = ctx.node_id == config["slow_node"]
    with open(os.path.join(config["out"], "starts.jsonl"), "a") as f:
        f.write(json.dumps({"attempt": ctx.attempt, "rank": ctx.rank, "node": ctx.node_id,
                            "ws": ctx.world_size}) + "\n")
    steps = MAX_STEPS if ctx.world_size > 1 else 5
    for step in range(steps):
        time.sleep(STEP_S * (3 if slow else 1))
        rayguard.train.report({"loss": 1.0 / (step + 1)}, step=step)


@pytest.mark.timeout(600)
def test_a_straggler_node_is_left_out_at_the_next_resize(no_ray, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    health = rayguard.HealthConfig(step_summary_interval_s=0.5, straggler_window_s=2.0,
                                   straggler_threshold=1.5, straggler_evict_after_s=1.0)
    with SimulatedCluster(worker_nodes=2, cpus_per_node=1) as cluster:
        fast, slow = cluster.nodes[0].node_id, cluster.nodes[1].node_id
        trainer = rayguard.RobustTrainer(
            _loop, train_loop_config={"out": str(out), "slow_node": slow},
            scaling_config=ScalingConfig(num_workers=(1, 2), resources_per_worker={"CPU": 1},
                                         elastic_resize_monitor_interval_s=1.0),
            run_config=RunConfig(storage_path=str(tmp_path), name="evict",
                                 failure_config=FailureConfig(max_failures=2)),
            guard_config=rayguard.GuardConfig(numa="off", preflight=False, health=health))
        result = cluster.join(cluster.fit_in_background(trainer), timeout_s=400)

    events = read_events(result.path)
    fenced = [e for e in events if e["kind"] == "node_quarantined"]
    assert [(e["node"], e["reason"]) for e in fenced] == [(slow, "straggler")], fenced
    flagged = [e for e in events if e["kind"] == "straggler"]
    assert flagged and flagged[0]["node"] == slow
    assert fenced[0]["time"] >= flagged[0]["time"]
    assert events[-1]["kind"] == "finished"

    starts = [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]
    first = [s for s in starts if s["attempt"] == 0]
    assert {s["node"] for s in first} == {slow, fast}
    last = max(s["attempt"] for s in starts)
    final = [s for s in starts if s["attempt"] == last]
    assert len(final) == 1 and final[0]["ws"] == 1 and final[0]["node"] != slow, starts
    # never placed on the straggler node once it was quarantined
    fenced_attempt = fenced[0]["attempt"]
    assert all(s["node"] != slow for s in starts if s["attempt"] > fenced_attempt), starts
