"""Elastic resizes and straggler eviction: ``ScalingConfig(num_workers=(min, max))`` under
rayguard's scaling policy (world sizes that keep the global batch exact, quarantined nodes
not counted) inside Ray Train's real controller, on a scripted cluster whose nodes come and
go (rayguard.testing.controller).

Proves the decisions of tests/ray/test_elastic_cluster.py::test_node_loss_and_return_keep_batch_and_data_exact
(the sizes 3 -> 2 -> 3 and the ranks kept by the survivors) and
tests/ray/test_straggler_eviction.py::test_a_straggler_node_is_left_out_at_the_next_resize.
Not covered here: the data and batch exactness of a resize (the ElasticSampler, the gradient
accumulation in real DDP: tests/unit/elastic), the worker's ``ctx.previous_rank`` (set in the
worker from the assignment record this harness checks), real step timings, and Ray's
autoscaling coordinator's own view of a changing cluster.
"""

from __future__ import annotations

import pytest
from ray.train import FailureConfig

import rayguard
from rayguard._ray.train import reserved_resources
from rayguard.elastic.remap import ASSIGNMENT_KEY


def forever(w):
    w.report(loss=1.0)
    if w.rank == 0:
        w.commit()


def sizes(h):
    return [len(g.nodes) for g in h.groups]


def elastic(harness, num_workers, nodes, loop=forever, **guard):
    """The whole-group restart path of elastic runs (the resize in place needs real
    workers: tests/unit/controller/test_resize.py, tests/ray/test_elastic_cluster.py)."""
    guard.setdefault("recovery", "restart")
    return harness(loop, num_workers=num_workers, nodes=nodes,
                   failure_config=FailureConfig(max_failures=4),
                   elastic_resize_monitor_interval_s=0.0,
                   guard=rayguard.GuardConfig(numa="off", preflight=False, **guard))


def test_a_lost_node_shrinks_the_group_and_a_returned_one_grows_it(harness):
    h = elastic(harness, (1, 3), {"n1": 1, "n2": 1, "n3": 1},
                global_batch_size=12, micro_batch_size=2).run_until_running()
    assert sizes(h) == [3]
    h.lose_node("n3")
    h.run(until=lambda h: len(h.groups) == 2 and h.state == "RUNNING")
    assert h.groups[1].nodes == ("n1", "n2")
    h.add_node("n4", 1)
    h.run(until=lambda h: len(h.groups) == 3 and h.state == "RUNNING")
    assert sizes(h) == [3, 2, 3] and h.groups[2].nodes == ("n1", "n2", "n4")
    assert [e["rank"] for e in h.events("worker_died")] == [2]
    assert len(h.events("restart")) == 1  # the grow is a resize, not a failure
    record = h.coordinator.get(ASSIGNMENT_KEY)  # RankOrder's record: the survivors kept
    ranks = {key.split("/")[0]: rank for key, rank in record["current"].items()}  # their ranks
    assert ranks == {h.node("n1"): 0, h.node("n2"): 1, h.node("n4"): 2}
    before = {key.split("/")[0]: rank for key, rank in record["previous"].items()}
    assert before == {h.node("n1"): 0, h.node("n2"): 1}


def test_the_world_size_is_rounded_down_to_one_that_keeps_the_global_batch(harness):
    # global 12 = micro 3 x accumulation x world: valid world sizes 1, 2, 4
    h = elastic(harness, (1, 4), {"n1": 1, "n2": 1, "n3": 1, "n4": 1},
                global_batch_size=12, micro_batch_size=3).run_until_running()
    h.lose_node("n4")  # room for 3: the run goes on with 2, not 3
    h.run(until=lambda h: len(h.groups) == 2 and h.state == "RUNNING")
    assert sizes(h) == [4, 2]
    h.add_node("n5", 1)
    h.run(until=lambda h: len(h.groups) == 3 and h.state == "RUNNING")
    assert sizes(h) == [4, 2, 4]


def test_below_the_smallest_valid_size_the_run_waits(harness):
    # global 12, micro 6: valid world sizes 1 and 2; min_workers=2
    h = elastic(harness, (2, 2), {"n1": 1, "n2": 1},
                global_batch_size=12, micro_batch_size=6)
    h.run_until_running()
    h.lose_node("n2")
    for _ in range(20):
        h.step()
    assert h.state == "RESTARTING" and sizes(h) == [2]  # waits, does not start 1 worker
    h.add_node("n3", 1)
    h.run(until=lambda h: len(h.groups) == 2 and h.state == "RUNNING")
    assert h.groups[1].nodes == ("n1", "n3")


def test_a_straggler_node_is_left_out_at_the_next_resize(harness):
    if not isinstance(reserved_resources([{"CPU": 1.0}]), dict):
        pytest.skip("Ray 2.59 reserves without node ids: only the placement leaves a node out")
    # tests/ray/test_straggler_eviction.py::test_a_straggler_node_is_left_out_at_the_next_resize
    def slow_on_slow_node(w):
        if w.world_size == 1 and w.step >= 4:
            return w.finish()
        if w.node_name == "slow" and w.ticks % 3:
            return  # 3x longer per step
        w.report(loss=1.0)

    health = rayguard.HealthConfig(step_summary_interval_s=0.5, straggler_window_s=2.0,
                                   straggler_threshold=1.5, straggler_evict_after_s=1.0)
    h = harness(slow_on_slow_node, num_workers=(1, 2), nodes={"fast": 1, "slow": 1},
                step_s=0.05, elastic_resize_monitor_interval_s=0.0,
                failure_config=FailureConfig(max_failures=2),
                guard=rayguard.GuardConfig(numa="off", preflight=False, health=health,
                                           recovery="restart")).run()
    assert h.state == "FINISHED"
    (fenced,) = h.events("node_quarantined")
    assert (fenced["node"], fenced["reason"]) == (h.node("slow"), "straggler")
    flagged = h.events("straggler")
    assert flagged and flagged[0]["node"] == h.node("slow")
    assert fenced["time"] >= flagged[0]["time"]
    assert [g.nodes for g in h.groups] == [("fast", "slow"), ("fast",)]
    assert "worker_died" not in h.kinds()  # evicted at a resize, not killed


def test_without_eviction_a_straggler_is_only_reported(harness):
    def slow_on_slow_node(w):
        if w.step >= 60:
            return w.finish()
        if w.node_name == "slow" and w.ticks % 3:
            return
        w.report(loss=1.0)

    health = rayguard.HealthConfig(step_summary_interval_s=0.5, straggler_window_s=2.0,
                                   straggler_threshold=1.5)
    h = harness(slow_on_slow_node, num_workers=(1, 2), nodes={"fast": 1, "slow": 1},
                step_s=0.05, elastic_resize_monitor_interval_s=0.0,
                guard=rayguard.GuardConfig(numa="off", preflight=False, health=health,
                                           recovery="restart")).run()
    assert h.state == "FINISHED" and h.events("straggler")
    assert "node_quarantined" not in h.kinds() and len(h.groups) == 1
