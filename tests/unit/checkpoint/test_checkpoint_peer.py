"""The memory tier's second copy: the peer planner (never the rank's own node, deterministic,
one node's loss leaves a copy of every shard), the registry's copies (own first, a copy on a
lost node left out, both freed on the next commit) and the ``restored`` event's copy fields."""

from __future__ import annotations

import itertools
import time

from rayguard import runtime
from rayguard.checkpoint.memory import Snapshot, SnapshotRegistry
from rayguard.checkpoint.peer import peer_node
from rayguard.train.memory_tier import _tier_fields


def test_the_peer_is_the_next_alive_node_in_sorted_order_never_the_own():
    nodes = ["n3", "n1", "n2"]
    assert [peer_node(n, nodes) for n in ("n1", "n2", "n3")] == ["n2", "n3", "n1"]
    assert peer_node("n2", nodes, alive={"n1", "n2"}) == "n1"  # n3 lost: wraps around
    assert peer_node("n1", ["n1"]) is None and peer_node("n1", []) is None  # one node: no peer
    assert peer_node("n1", ["n1", "n2"], alive={"n1"}) is None
    assert peer_node("n0", ["n1", "n2"]) == "n1"  # own not among the workers' nodes
    assert peer_node("n2", ["n1", "n2", "n2"]) == "n1"


def peer_plan(nodes_by_rank: dict[int, str]) -> dict[int, str | None]:
    """``{rank: peer node}``: what :func:`peer_node` answers for each rank's node, among the
    nodes of the run's workers (as the coordinator asks it, rank by rank)."""
    nodes = set(nodes_by_rank.values())
    return {rank: peer_node(node, nodes) for rank, node in sorted(nodes_by_rank.items())}


def test_one_node_lost_leaves_a_copy_of_every_shard_and_each_node_backs_one_other():
    for count in (2, 3, 5):
        nodes = [f"node{i}" for i in range(count)]
        for ranks_per_node in (1, 2):
            by_rank = {r: nodes[r // ranks_per_node]
                       for r in range(count * ranks_per_node)}
            plan = peer_plan(by_rank)
            assert plan == peer_plan(dict(reversed(list(by_rank.items()))))  # deterministic
            assert all(plan[r] not in (None, by_rank[r]) for r in by_rank)
            for lost in nodes:
                assert all(by_rank[r] != lost or plan[r] != lost for r in by_rank)
            # a node holds the peer copies of exactly one other node's ranks (memory bound)
            backed = {n: {by_rank[r] for r in by_rank if plan[r] == n} for n in nodes}
            assert all(len(sources) == 1 for sources in backed.values()), backed
    assert peer_plan({0: "a", 1: "a"}) == {0: None, 1: None}


def _snap(path, step, rank, node):
    return Snapshot(path, step, rank, node, {"f": "d"}, [f"own-{path}-{rank}"])


def test_copies_are_own_first_then_peer_and_a_lost_nodes_copy_is_left_out():
    reg = SnapshotRegistry()
    reg.offer(_snap("c1", 1, 0, "a"))
    reg.offer(_snap("c1", 1, 1, "b"))
    assert reg.nodes_of("c1") == {0: "a", 1: "b"}
    assert reg.offer_peer("c1", 0, "b", ["peer-0"]) and reg.offer_peer("c1", 1, "a", ["peer-1"])
    assert not reg.offer_peer("c1", 0, "a", ["x"])  # the own node is no peer
    assert not reg.offer_peer("c1", 2, "a", ["x"]) and not reg.offer_peer("c9", 0, "b", ["x"])
    assert reg.copies("c1", 1) == []  # not committed yet
    reg.commit("c1", 1)
    assert reg.copies("c1", 1) == [("own", "b", ["own-c1-1"]), ("peer", "a", ["peer-1"])]
    assert reg.copies("c1", 1, alive={"a"}) == [("peer", "a", ["peer-1"])]  # b lost
    assert reg.copies("c1", 0, alive={"a"}) == [("own", "a", ["own-c1-0"])]
    assert reg.copies("c1", 1, alive=set()) == []  # both gone: the disk
    assert reg.lookup("c1", 1).peer == "a"


def test_the_next_commit_frees_both_copies_of_the_previous_checkpoint():
    reg = SnapshotRegistry()
    for path, step in (("c1", 1), ("c2", 2)):
        for rank, (own, peer) in enumerate(itertools.permutations("ab")):
            reg.offer(_snap(path, step, rank, own))
            reg.offer_peer(path, rank, peer, [f"peer-{path}-{rank}"])
        if path == "c1":
            reg.commit(path, step)
    # peak: the committed checkpoint and the one being saved, two copies each
    assert sorted((s.path, s.peer is not None) for s in reg.held()) == [
        ("c1", True), ("c1", True), ("c2", True), ("c2", True)]
    dropped = reg.commit("c2", 2)
    assert sorted((s.path, s.peer) for s in dropped) == [("c1", "a"), ("c1", "b")]
    assert all(s.path == "c2" for s in reg.held())
    assert [c[0] for c in reg.copies("c2", 0)] == ["own", "peer"]


def test_the_restored_event_says_which_copy_served_each_rank():
    assert _tier_fields([True, True], True, ["own", "own"]) == {
        "tier": "memory", "disk_hashing_skipped": True, "copy": "own"}
    assert _tier_fields([True, True], True, ["own", "peer"]) == {
        "tier": "memory", "disk_hashing_skipped": True, "copy": "mixed",
        "copies": ["own", "peer"]}
    assert _tier_fields([True, False], False, ["peer", None]) == {
        "tier": "mixed", "tiers": ["memory", "disk"], "copy": "peer",
        "copies": ["peer", None]}
    assert _tier_fields([False, False], False, [None, None]) == {"tier": "disk"}
    assert _tier_fields([True], False) == {"tier": "memory"}  # no copy reported


class _SlowLink:
    """A link whose peer answer waits for ``release`` (the copy of the first checkpoint is
    still travelling while the next ones are saved)."""

    def __init__(self):
        import threading

        self.asked: list[str] = []
        self.release = threading.Event()

    def memory_copy_to_peer(self, final):
        self.asked.append(final)
        self.release.wait(30)
        return None  # no peer: nothing is copied


def test_a_newer_peer_copy_replaces_the_one_still_waiting_and_none_blocks_the_caller():
    from rayguard.train import memory_peer

    link = _SlowLink()
    memory_peer.queue_peer_copy(link, "c1")
    for _ in range(200):  # c1 is running (its peer question is out)
        if link.asked:
            break
        time.sleep(0.01)
    memory_peer.queue_peer_copy(link, "c2")  # waits behind c1 ...
    memory_peer.queue_peer_copy(link, "c3")  # ... and is replaced by c3
    assert link.asked == ["c1"]
    link.release.set()
    memory_peer.wait_idle(30)
    assert link.asked == ["c1", "c3"]
    assert runtime.current().peer_thread is None and runtime.current().peer_waiting is None
