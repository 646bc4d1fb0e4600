"""The memory tier's look-ups (a restore) and peer copies (an in-memory checkpoint) go once
per node (rayguard.run.node_asks, rayguard.run.memory_link), proven without a cluster, as in
test_node_messages.py: the real coordinator and real node aggregators on one event loop in a
thread, the ranks real RunLinks in the test's threads, fake actor handles for Ray's, fake
keepers. Counted: the coordinator's calls (one per node, not per rank), its questions of
Ray's node table, the keepers' pings and copies; kept: each rank's own answer, also when the
agent is dead from the start, dies midway or does not answer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from fake_actors import Handle

import rayguard.run.memory_host as memory_host
from rayguard.checkpoint.peer import peer_node
from rayguard.run.agent import NodeAggregator
from rayguard.run.coordinator import RunCoordinator
from rayguard.run.link import RunLink
from rayguard.run.timeouts import LinkTimeouts
from rayguard.run.upstream import RayUpstream

FLUSH_S = 1.0  # long: every rank's call is in before a node's batch goes (a loaded machine)
PATH = "/ckpt/step-5"


class Up(RayUpstream):
    """The coordinator as an agent's upstream (the real ``RayUpstream`` over a handle whose
    calls run on the loop); counts the calls."""

    def __init__(self, c: RunCoordinator) -> None:
        super().__init__(SimpleNamespace())
        self.c = c
        self.calls: Counter[str] = Counter()

    async def memory_lookup_many(self, path, ranks):
        self.calls["memory_lookup_many"] += 1
        return await self.c.memory_lookup_many(path, ranks)

    async def memory_copy_to_peer_many(self, path, ranks, world_size, wait_s, timeout_s):
        self.calls["memory_copy_to_peer_many"] += 1
        return await self.c.memory_copy_to_peer_many(path, ranks, world_size, wait_s, timeout_s)


class Keeper:
    """A node's keeper: answers pings (unless ``silent``) and holds copies (``hold``: the
    copy of a reference, after ``hold_s``; raises for the references in ``fail``)."""

    def __init__(self, node: str, hold_s: float = 0.0) -> None:
        self.node, self.hold_s, self.silent = node, hold_s, False
        self.pings = 0
        self.held: list[Any] = []
        self.fail: set[Any] = set()
        self.in_flight = self.most_in_flight = 0
        keeper = self
        self.ping = SimpleNamespace(remote=lambda: keeper._ping())
        self.hold = SimpleNamespace(remote=lambda ref: keeper._hold(ref))

    async def _ping(self) -> bool:
        self.pings += 1
        if self.silent:
            await asyncio.sleep(3600)
        return True

    async def _hold(self, ref: Any) -> list[Any]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.hold_s)
            if ref in self.fail:
                raise OSError(f"{self.node}: the object store is full")
            self.held.append(ref)
            return [("copy", self.node, ref)]
        finally:
            self.in_flight -= 1


class Run:
    """A coordinator with every rank's memory copy of ``PATH`` offered (and committed),
    ``nodes`` aggregators, a keeper per node, and ``nodes * per_node`` ranks' links."""

    def __init__(self, nodes: int, per_node: int, *, agents: bool = True,
                 memory_s: float = 30.0, hold_s: float = 0.0, peers: bool = False,
                 **agent_kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.c = RunCoordinator("/dev/null", {"run": "t", "metrics": None})
        self.up = Up(self.c)
        self.coordinator = Handle(self.c, self.loop)
        self.aggs = [NodeAggregator(self.up, f"n{n}") for n in range(nodes)]
        for agg in self.aggs:
            agg.lookups.flush_s = agg.peer_copies.flush_s = FLUSH_S
        self.agents = [Handle(agg, self.loop, **agent_kw) for agg in self.aggs]
        self.keepers = {f"n{n}": Keeper(f"n{n}", hold_s) for n in range(nodes)}
        self.c._keepers.update(self.keepers)
        self.world = nodes * per_node
        self.links = [
            RunLink(SimpleNamespace(rank=r, node_id=f"n{r // per_node}", attempt=2,
                                    world_size=self.world, local_world_size=per_node),
                    self.coordinator, agent=self.agents[r // per_node] if agents else None,
                    timeouts=LinkTimeouts(ack_s=5.0, answer_s=30.0, memory_s=memory_s))
            for r in range(self.world)]
        for r, link in enumerate(self.links):  # every rank's own copy: refs name the rank
            self.c.memory_offer(PATH, 5, r, link.ctx.node_id, {"w": f"d{r}"}, [f"ref{r}"])
            if peers:  # and a second copy on the next node
                self.c._memory.offer_peer(PATH, r, self.peer_of(r), [f"peer{r}"])
        self.c.memory_commit(PATH, 5)

    def peer_of(self, rank: int) -> str:
        return peer_node(self.links[rank].ctx.node_id, self.keepers)

    def each_rank(self, body: Any) -> list[Any]:
        """``body(link)`` on every rank at once (a thread each); their results."""
        start = threading.Barrier(len(self.links))

        def rank(link: RunLink) -> Any:
            start.wait()
            return body(link)

        with concurrent.futures.ThreadPoolExecutor(len(self.links)) as pool:
            return list(pool.map(rank, self.links))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@pytest.fixture(autouse=True)
def fake_ray(monkeypatch) -> Counter:
    """``ray.get`` of a fake reference; Ray's node table (every ``n*`` node alive),
    counted; a clock that stands still (every call inside one freshness window)."""
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref.result(timeout))
    asked: Counter[str] = Counter()

    def alive_nodes() -> set[str]:
        asked["node_table"] += 1
        return {f"n{n}" for n in range(64)}

    monkeypatch.setattr(memory_host, "_alive_nodes", alive_nodes)
    monkeypatch.setattr(memory_host, "_now", lambda: 100.0)
    monkeypatch.setattr(memory_host, "KEEPER_PING_S", 0.3)
    return asked


def own(link: RunLink) -> Any:
    """This rank's look-up of its own shard, as a restore asks it."""
    return link.memory_lookup(PATH, link.ctx.rank)


def expected(run: Run, rank: int, peers: bool = False) -> Any:
    copies = [("own", run.links[rank].ctx.node_id, [f"ref{rank}"])]
    if peers:
        copies.append(("peer", run.peer_of(rank), [f"peer{rank}"]))
    return copies, {"w": f"d{rank}"}


# -- restore look-ups -------------------------------------------------------------------------
def test_every_ranks_restore_look_up_is_one_call_per_node(fake_ray):
    run = Run(nodes=4, per_node=8, peers=True)
    try:
        got = run.each_rank(own)
        shared = run.each_rank(lambda link: link.memory_lookup(PATH, 0))  # rank 0's shard
    finally:
        run.close()
    assert got == [expected(run, r, peers=True) for r in range(32)]  # each its own answer
    assert shared == [expected(run, 0, peers=True)] * 32
    assert run.up.calls["memory_lookup_many"] == 2 * 4  # was 2 * 32 calls
    assert run.coordinator.calls == Counter()  # nothing straight from a rank
    assert fake_ray["node_table"] == 1  # was one per call
    # a node's two copies are pinged once per call: its own keeper and its ranks' peer's
    assert sum(k.pings for k in run.keepers.values()) == 4 * 2 + 4 * 2


def test_a_keeper_that_does_not_answer_leaves_its_copies_out_of_each_ranks_answer(fake_ray):
    run = Run(nodes=4, per_node=4, peers=True)
    run.keepers["n1"].silent = True  # n1 is lost, Ray does not know it yet
    with run:
        got = run.each_rank(own)
    for r, (copies, digests) in enumerate(got):
        full, _ = expected(run, r, peers=True)
        assert digests == {"w": f"d{r}"}
        assert copies == [c for c in full if c[1] != "n1"]  # never empty: one copy is elsewhere


def test_without_agents_each_rank_looks_up_straight_with_one_node_table_query(fake_ray):
    run = Run(nodes=4, per_node=8, agents=False)
    with run:
        got = run.each_rank(own)
    assert got == [expected(run, r) for r in range(32)]
    assert run.coordinator.calls == Counter({"memory_lookup": 32})
    assert fake_ray["node_table"] == 1  # the cache: 32 calls at once, one question


def test_a_dead_agent_sends_every_look_up_straight(fake_ray):
    run = Run(nodes=2, per_node=4, dead=True)
    with run:
        got = run.each_rank(own)
    assert got == [expected(run, r) for r in range(8)]
    assert run.coordinator.calls == Counter({"memory_lookup": 8})
    assert run.up.calls["memory_lookup_many"] == 0


def test_an_agent_that_dies_midway_sends_the_rest_straight(fake_ray):
    run = Run(nodes=2, per_node=4)
    try:
        first = run.each_rank(own)
        for agent in run.agents:
            agent.dead = True
        then = run.each_rank(own)
    finally:
        run.close()
    assert first == then == [expected(run, r) for r in range(8)]
    assert run.up.calls["memory_lookup_many"] == 2
    assert run.coordinator.calls == Counter({"memory_lookup": 8})


def test_a_look_up_the_agent_does_not_answer_is_asked_straight(fake_ray):
    run = Run(nodes=2, per_node=4, memory_s=1.0, late=("memory_lookup",))
    for agg in run.aggs:
        agg.lookups.flush_s = 0.01
    with run:
        got = run.each_rank(own)
    assert got == [expected(run, r) for r in range(8)]
    assert run.coordinator.calls == Counter({"memory_lookup": 8})


# -- peer copies ------------------------------------------------------------------------------
def copied(run: Run) -> dict[int, Any]:
    """``{rank: the peer copy's references}`` as the coordinator holds them."""
    return {r: run.c._memory.snapshot(PATH, r).peer_refs for r in range(run.world)}


def test_every_ranks_peer_copy_is_one_call_per_node_and_copies_at_once(fake_ray):
    run = Run(nodes=4, per_node=4, hold_s=0.2)
    with run:
        got = run.each_rank(lambda link: link.memory_copy_to_peer(PATH))
    assert got == [run.peer_of(r) for r in range(16)]  # each rank its own peer
    assert run.up.calls["memory_copy_to_peer_many"] == 4  # was 16 calls
    assert run.coordinator.calls == Counter()
    assert copied(run) == {r: [("copy", run.peer_of(r), f"ref{r}")] for r in range(16)}
    assert sorted(r for k in run.keepers.values() for r in k.held) == sorted(
        f"ref{r}" for r in range(16))  # each rank's snapshot copied once
    assert max(k.most_in_flight for k in run.keepers.values()) == 4  # a batch's copies at once


def test_a_failed_copy_in_a_batch_is_that_ranks_none_only(fake_ray):
    run = Run(nodes=2, per_node=4)
    run.keepers["n1"].fail.add("ref2")
    with run:
        got = run.each_rank(lambda link: link.memory_copy_to_peer(PATH))
    assert got == [run.peer_of(r) if r != 2 else None for r in range(8)]
    assert run.coordinator.calls == Counter()  # a failed copy is an answer: not re-asked


def test_without_agents_or_with_a_dead_one_each_rank_copies_straight(fake_ray):
    for kw in ({"agents": False}, {"dead": True}):
        run = Run(nodes=2, per_node=4, **kw)
        with run:
            got = run.each_rank(lambda link: link.memory_copy_to_peer(PATH))
        assert got == [run.peer_of(r) for r in range(8)]
        assert run.coordinator.calls == Counter({"memory_copy_to_peer": 8})
        assert copied(run) == {r: [("copy", run.peer_of(r), f"ref{r}")] for r in range(8)}


def test_a_peer_copy_the_agent_does_not_answer_is_asked_straight(fake_ray):
    run = Run(nodes=2, per_node=4, memory_s=1.0, late=("memory_copy_to_peer",))
    for agg in run.aggs:
        agg.peer_copies.flush_s = 0.01
    with run:
        got = run.each_rank(lambda link: link.memory_copy_to_peer(PATH))
    assert got == [run.peer_of(r) for r in range(8)]
    assert run.coordinator.calls == Counter({"memory_copy_to_peer": 8})


# -- Ray's node table, asked once per freshness window ----------------------------------------
def test_the_nodes_alive_are_asked_once_per_window_whatever_the_calls(fake_ray, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(memory_host, "_now", lambda: clock[0])
    c = RunCoordinator("/dev/null", {"run": "t", "metrics": None})
    c._keepers.update({n: Keeper(n) for n in ("n0", "n1")})
    for r in range(8):
        c.memory_offer(PATH, 5, r, f"n{r % 2}", {}, [f"ref{r}"])
    c.memory_commit(PATH, 5)

    async def at_once(n: int) -> None:
        await asyncio.gather(*(c.memory_lookup(PATH, r % 8) for r in range(n)))

    async def main() -> list[int]:
        seen = []
        await at_once(64)  # 64 calls at once share one question
        seen.append(fake_ray["node_table"])
        clock[0] += memory_host.ALIVE_FRESH_S / 2
        await at_once(64)
        await c.memory_copy_to_peer(PATH, 0, 8, 0.0, 5.0)  # within the window: no question
        seen.append(fake_ray["node_table"])
        clock[0] += memory_host.ALIVE_FRESH_S
        await at_once(64)  # the window passed: asked again
        seen.append(fake_ray["node_table"])
        return seen

    assert asyncio.run(main()) == [1, 1, 2]
