"""Live recovery when a node is lost, on a simulated cluster (a CPU-less head and three
1-CPU nodes; the 2-worker group uses two of them): the node of rank 1 is removed mid-run.
Ray's replacement of one worker would wait without end for the placement-group bundle on
the dead node, so live recovery falls back to a restart of the whole group, placed anew
(the spare node takes the lost rank), recorded as such (when the poll already knows the
node dead, as Ray's health check makes usual); the weights end bitwise equal to a run
without faults."""

from __future__ import annotations

import os
import time

import pytest
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.cluster import SimulatedCluster, wait_for
from rayguard.testing.exact_loop import exact_loop, read_lines

STEPS = 24


def _trainer(tmp_path, name, config):
    return rayguard.RobustTrainer(
        exact_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(tmp_path), name=name,
                             failure_config=FailureConfig(max_failures=3,
                                                          controller_failure_limit=0)),
        guard_config=rayguard.GuardConfig(seed=0, numa="off", preflight=False,
                                          recovery="live"))


@pytest.mark.timeout(600)
def test_a_lost_node_falls_back_to_a_group_restart(no_ray, tmp_path):
    with SimulatedCluster(worker_nodes=3, cpus_per_node=1) as cluster:
        # the reference needs no pace: a step's sleep leaves the weights as they are
        clean_cfg = {"steps": STEPS, "out": str(tmp_path / "clean.pt"),
                     "log": str(tmp_path / "clean.jsonl")}
        cluster.join(cluster.fit_in_background(_trainer(tmp_path, "clean", clean_cfg)))
        cfg = {"steps": STEPS, "out": str(tmp_path / "lost.pt"),  # paced: the loss comes mid-run
               "log": str(tmp_path / "lost.jsonl"), "step_s": 0.2}
        thread = cluster.fit_in_background(_trainer(tmp_path, "lost", cfg))
        wait_for(lambda: len(read_lines(cfg["log"] + ".steps")) >= 6, timeout_s=300,
                 what="six steps")
        victim = next(e["node"] for e in read_lines(cfg["log"]) if e["rank"] == 1)
        index = next(i for i, n in enumerate(cluster.nodes) if n.node_id == victim)
        cluster.remove_worker_node(index)
        removed_at = time.time()
        result = cluster.join(thread, timeout_s=400)
    assert os.path.exists(cfg["out"])
    clean, lost = (torch.load(p, weights_only=True) for p in (clean_cfg["out"], cfg["out"]))
    assert clean.keys() == lost.keys() and all(torch.equal(clean[k], lost[k]) for k in clean)
    events = read_events(result.path)
    restarts = [e for e in events if e["kind"] == "restart"]
    assert restarts and all(e["time"] >= removed_at - 1 for e in restarts)
    entered = read_lines(cfg["log"])
    rank0 = [e for e in entered if e["rank"] == 0]
    rank1 = [e for e in entered if e["rank"] == 1]
    assert rank1[-1]["node"] != victim
    assert len(restarts) == 1, restarts
    if restarts[0].get("path") == "live":  # the node's death not yet known at the poll:
        assert len({e["pid"] for e in rank0}) == 1, entered  # Ray moved the bundle
    else:
        assert restarts[0].get("path") is None, restarts
        assert victim[:12] in restarts[0]["fallback"] and "lost" in restarts[0]["fallback"]
        assert len({e["pid"] for e in rank0}) == 2, entered  # a new group: new processes
    died = [e for e in events if e["kind"] == "worker_died"]
    assert [e["rank"] for e in died] == [1], died  # the survivor is not recorded as dead
