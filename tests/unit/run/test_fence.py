"""The run's quarantine in its coordinator (NodeFence): counting, the node_quarantined event
and metric, the run directory's file, a lift taking effect at the next worker-group start,
and straggler eviction."""

from __future__ import annotations

import json
from pathlib import Path

from rayguard.health import quarantine_file
from rayguard.health.eviction import RankScore
from rayguard.health.quarantine import NodeFailure
from rayguard.observe.metrics import event_updates
from rayguard.run.coordinator import RunCoordinator
from rayguard.run.fence import NodeFence

A, B = "a" * 56, "b" * 56


def _record(c: RunCoordinator, failure: NodeFailure, nodes_alive: int | None = None) -> bool:
    """Count one failure against its node; whether the node is now quarantined."""
    return failure.node in c.record_node_failures([failure], nodes_alive)


def coordinator(tmp_path: Path, **fence) -> RunCoordinator:
    fence.setdefault("path", str(quarantine_file.quarantine_path(tmp_path)))
    return RunCoordinator(str(tmp_path / "events.jsonl"), fence=fence)


def events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_attempts_quarantine_the_node_once_with_event_file_and_metric(tmp_path) -> None:
    c = coordinator(tmp_path, quarantine_after=2)
    assert c.record_node_failures([NodeFailure(A, 0, "killed", 0), NodeFailure(A, 0, "killed", 1)],
                                  nodes_alive=3) == []
    assert c.excluded_nodes() == []
    assert _record(c, NodeFailure(A, 1, "oom", 1, "out of memory"), nodes_alive=3)
    assert not _record(c, NodeFailure(A, 2, "killed"), nodes_alive=3)  # already quarantined
    fenced = [e for e in events(tmp_path) if e["kind"] == "node_quarantined"]
    assert len(fenced) == 1
    e = fenced[0]
    assert (e["node"], e["reason"], e["attempts"], e["rank"]) == (A, "oom", [0, 1], 1)
    assert e["quarantined_nodes"] == 1 and str(tmp_path) in e["detail"]
    assert [(u.name, u.value) for u in event_updates(e)] == [("rayguard_quarantined_nodes", 1.0)]
    assert c.excluded_nodes() == [A] and c.quarantined_nodes()[A]["reason"] == "oom"
    state = quarantine_file.read(quarantine_file.quarantine_path(tmp_path))
    assert list(state["nodes"]) == [A]


def test_a_lift_takes_effect_at_the_next_group_and_forgives_earlier_failures(tmp_path) -> None:
    c = coordinator(tmp_path, quarantine_after=2)
    c.open_attempt("restart"), c.open_attempt("restart")
    c.record_node_failures([NodeFailure(A, 0, "killed"), NodeFailure(A, 1, "killed")])
    assert c.excluded_nodes() == [A]
    quarantine_file.lift(quarantine_file.quarantine_path(tmp_path), ["aaaaaa"])
    assert c.excluded_nodes() == []
    lifted = [e for e in events(tmp_path) if e["kind"] == "quarantine_lifted"]
    assert [(e["node"], e["quarantined_nodes"]) for e in lifted] == [(A, 0)]
    assert "from attempt 2 on" in lifted[0]["detail"]
    assert event_updates(lifted[0])[0].value == 0.0
    assert c.record_node_failures([NodeFailure(A, 2, "killed")]) == []  # one new failure only
    assert c.record_node_failures([NodeFailure(A, 3, "killed")]) == [A]


def test_a_later_run_in_the_same_directory_keeps_the_quarantine(tmp_path) -> None:
    first = coordinator(tmp_path, quarantine_after=1)
    _record(first, NodeFailure(A, 0, "preflight"))
    second = coordinator(tmp_path, quarantine_after=1)
    assert second.excluded_nodes() == [A]
    off = coordinator(tmp_path, quarantine_after=None)  # quarantine off: counts nothing
    assert not _record(off, NodeFailure(B, 0, "killed"))


def test_the_only_node_is_never_quarantined(tmp_path) -> None:
    c = coordinator(tmp_path, quarantine_after=2)
    c.record_node_failures([NodeFailure(A, 0, "killed")], nodes_alive=1)
    assert c.record_node_failures([NodeFailure(A, 1, "killed")], nodes_alive=1) == []
    assert c.excluded_nodes() == [] and not quarantine_file.quarantine_path(tmp_path).exists()


def test_a_remote_run_keeps_the_quarantine_in_memory(tmp_path) -> None:
    fence = NodeFence(quarantine_after=1, path=None)
    assert [e["node"] for e in fence.record([NodeFailure(A, 0, "killed")])] == [A]
    assert fence.excluded(0) == ([A], [])
    assert "lift RUN_DIR" in fence.record([NodeFailure(B, 0, "killed")])[0]["detail"]


def test_an_unreadable_file_keeps_what_the_run_knows(tmp_path) -> None:
    c = coordinator(tmp_path, quarantine_after=1)
    _record(c, NodeFailure(A, 0, "killed"))
    quarantine_file.quarantine_path(tmp_path).write_text("garbage")
    assert c.excluded_nodes() == [A]  # not lifted by a broken file


def test_straggler_eviction_quarantines_at_once(tmp_path) -> None:
    fence = NodeFence(quarantine_after=2, path=None, straggler_evict_after_s=5,
                      straggler_threshold=1.5)
    ranks = {0: RankScore(0.5, False, A), 1: RankScore(2.5, True, B)}
    assert fence.on_scores(0, 10.0, ranks) == []
    out = fence.on_scores(0, 15.0, ranks)
    assert [(e["node"], e["reason"], e["rank"]) for e in out] == [(B, "straggler", 1)]
    assert fence.on_scores(0, 30.0, ranks) == []
    assert NodeFence(quarantine_after=2, straggler_evict_after_s=None).eviction is None


def test_the_coordinator_evicts_a_straggler_from_step_summaries(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"),
                       observe={"run": "r", "metrics": None, "straggler_threshold": 1.5,
                                "straggler_window_s": 2.0},
                       fence={"quarantine_after": 2, "path": None,
                              "straggler_evict_after_s": 1.0, "straggler_threshold": 1.5})
    for t in range(8):
        for rank, node, step_s in ((0, A, 0.05), (1, B, 0.15)):
            c.step_summary({"rank": rank, "node": node, "attempt": 0, "time": 100.0 + t,
                            "first_time": 100.0, "intervals": 10, "step_time_sum_s": 10 * step_s,
                            "reports": 10, "blocked_sum_s": 0.01})
    kinds = [(e["kind"], e.get("node")) for e in events(tmp_path) if e["kind"] != "steps"]
    assert kinds == [("straggler", B), ("node_quarantined", B)]
    assert c.excluded_nodes() == [B]


def test_a_diagnosed_hang_counts_against_its_culprits_node(tmp_path) -> None:
    from rayguard.events import make_event

    c = coordinator(tmp_path, quarantine_after=2)
    for attempt in (0, 1):
        c._record_diagnosis(make_event(
            "hang_diagnosed", f"rank 1 on node {B[:8]} never entered all_reduce #{attempt}",
            attempt=attempt, culprits=[1], waiting=[0], nodes={"1": B}))
    kinds = [e["kind"] for e in events(tmp_path)]
    assert kinds.count("hang_diagnosed") == 2
    assert list(c.quarantined_nodes()) == [B]
    fenced = next(e for e in events(tmp_path) if e["kind"] == "node_quarantined")
    assert (fenced["reason"], fenced["attempts"]) == ("hang_culprit", [0, 1])
    assert A not in c.quarantined_nodes()  # the waiting rank's node is not blamed


def _plant(tmp_path, *nodes: str) -> None:
    entry = {"reason": "killed", "time": 1.7e9, "failures": [{"attempt": 0, "reason": "killed"}]}
    quarantine_file.quarantine_path(tmp_path).write_text(
        json.dumps({"version": 1, "nodes": {n: entry for n in nodes}, "lifted": {}}))


def test_a_planted_file_naming_the_only_node_does_not_fence_it(tmp_path) -> None:
    _plant(tmp_path, A)
    fence = NodeFence(quarantine_after=2, path=str(quarantine_file.quarantine_path(tmp_path)),
                      alive_nodes=lambda: {A})
    assert fence.excluded(0) == ([], []) and fence.quarantined() == {}


def test_a_planted_file_naming_every_node_fences_none_of_them(tmp_path) -> None:
    _plant(tmp_path, A, B)
    alive = {A, B}
    fence = NodeFence(quarantine_after=1, path=str(quarantine_file.quarantine_path(tmp_path)),
                      alive_nodes=lambda: alive)
    assert fence.excluded(0) == ([], [])
    assert [e["node"] for e in fence.record([NodeFailure(A, 0, "killed")])] == [A]
    assert fence.excluded(0)[0] == [A]  # the run's own rule still fences A; B is admitted
    assert list(fence.quarantined()) == [A]
    alive.add("c" * 56)  # room again: the file's entry applies
    assert fence.excluded(0)[0] == [A, B]
