"""The quarantine: a node whose workers keep dying is fenced off, a fixed-size run that no
longer fits waits for capacity (one ``placement_wait``), and it starts on a node added later;
decided by rayguard's callback, fence view and FencedFixedPolicy inside Ray Train's real
controller, with the real quarantine file in the run directory (rayguard.testing.controller).

Proves the decisions of tests/ray/test_quarantine_cluster.py::
test_a_node_whose_workers_keep_dying_is_quarantined_and_the_run_moves. Not covered here: Ray
placing a real placement group by the ``ray.io/node-id`` label selector (the harness places
by its own reading of the selector), the SIGKILL of a real worker, ``rayguard quarantine list``
(tests/unit/cli), and the autoscaler's view of a node joining a real cluster.
"""

from __future__ import annotations

import pytest
from ray.train import FailureConfig

import rayguard
from rayguard._ray.train import reserved_resources
from rayguard.health import quarantine_file


def dies_on_bad(w):
    if w.node_name == "bad":
        return w.die("SIGKILL")  # a broken machine: its workers are killed there
    if w.step >= 2:
        return w.finish()
    w.report(loss=1.0)


def fenced_run(harness, **health):
    return harness(dies_on_bad, num_workers=2, nodes={"head": 0, "bad": 2},
                   failure_config=FailureConfig(max_failures=3),
                   guard=rayguard.GuardConfig(numa="off", preflight=False,
                                              health=rayguard.HealthConfig(**health)))


def waiting(h):
    return bool(h.events("placement_wait"))


def test_a_node_whose_workers_keep_dying_is_quarantined_and_the_run_moves(harness):
    h = fenced_run(harness, quarantine_after=2).run(until=waiting)
    (fenced,) = h.events("node_quarantined")
    assert (fenced["node"], fenced["reason"], fenced["attempts"]) == (h.node("bad"), "killed", [0, 1])
    assert fenced["quarantined_nodes"] == 1
    (wait,) = h.events("placement_wait")
    assert wait["room"] == 0 and wait["wanted"] == 2 and wait["quarantined"] == [h.node("bad")]
    assert "Waiting for capacity" in wait["detail"] and "quarantine lift" in wait["detail"]
    for _ in range(20):  # it waits, and says so once
        h.step()
    assert h.state == "RESTARTING" and len(h.events("placement_wait")) == 1
    assert [g.attempt for g in h.groups] == [0, 1]

    h.add_node("good", 2)
    h.run()
    assert h.state == "FINISHED"
    assert [g.nodes for g in h.groups] == [("bad", "bad"), ("bad", "bad"), ("good", "good")]
    state = quarantine_file.read(quarantine_file.quarantine_path(h.run_dir))
    assert list(state["nodes"]) == [h.node("bad")]
    assert state["nodes"][h.node("bad")]["reason"] == "killed"


def test_the_clusters_only_node_is_never_quarantined(harness):
    h = harness(dies_on_bad, num_workers=2, nodes={"bad": 2},
                failure_config=FailureConfig(max_failures=3)).run()
    assert h.state == "ERRORED" and "node_quarantined" not in h.kinds()
    assert len(h.groups) == 4  # Ray's budget, every attempt on the one node


def test_quarantine_off_counts_no_node(harness):
    h = fenced_run(harness, quarantine_after=None).run()
    assert h.state == "ERRORED" and "node_quarantined" not in h.kinds()
    assert not h.events("placement_wait")


def test_a_lifted_quarantine_takes_effect_at_the_next_start(harness):
    h = fenced_run(harness, quarantine_after=2).run(until=waiting)
    quarantine_file.lift(quarantine_file.quarantine_path(h.run_dir), [h.node("bad")])
    h.run(until=lambda h: len(h.groups) == 3)
    assert h.groups[2].nodes == ("bad", "bad")
    assert [e["node"] for e in h.events("quarantine_lifted")] == [h.node("bad")]


def test_an_elastic_run_goes_on_without_a_quarantined_node(harness):
    if not isinstance(reserved_resources([{"CPU": 1.0}]), dict):
        pytest.skip("Ray 2.59 reserves without node ids: only the placement leaves a node out")
    # the elastic policy counts only admitted nodes: it shrinks instead of waiting
    def dies_on_bad_or_ends(w):
        if w.node_name == "bad":
            return w.die("SIGKILL")
        if w.step >= 2:
            return w.finish()
        w.report(loss=1.0)

    h = harness(dies_on_bad_or_ends, num_workers=(1, 2), nodes={"good": 1, "bad": 1},
                failure_config=FailureConfig(max_failures=3),
                elastic_resize_monitor_interval_s=0.0).run()
    assert h.state == "FINISHED" and not h.events("placement_wait")
    (fenced,) = h.events("node_quarantined")
    assert fenced["node"] == h.node("bad") and fenced["attempts"] == [0, 1]
    assert [g.nodes for g in h.groups] == [("good", "bad"), ("good", "bad"), ("good",)]
