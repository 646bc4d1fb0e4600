"""What every rank says or asks at once goes once per node (rayguard.run.outbox,
rayguard.run.node_asks, rayguard.run.message_link), proven without a cluster: the real
coordinator and real node aggregators run on one event loop in a thread (as Ray runs an
async actor), the ranks are real RunLinks in the test's threads, and a fake actor handle
stands for Ray's (``h.method.remote(...)`` gives a future that ``ray.get`` reads). Counted:
the coordinator's calls (one per node, not per rank); kept: every event exactly once and in
each rank's order, and every memory-tier offer registered exactly once with its references,
also when the agent dies or answers late."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from fake_actors import Handle, call

import rayguard.train.live as live
from rayguard.controller.resize import go_key, left_key
from rayguard.elastic.remap import ASSIGNMENT_KEY
from rayguard.health.live import live_key
from rayguard.run.agent import NodeAggregator
from rayguard.run.coordinator import RunCoordinator
from rayguard.run.link import RunLink
from rayguard.run.outbox import EVENT, Delivered, Outbox
from rayguard.run.timeouts import LinkTimeouts

FLUSH_S = 1.0  # long: every rank's call is in before a node's batch goes (a loaded machine)
WIDE_FLUSH_S = 3.0  # 128 ranks' threads: one node's batch was split in two under load at 1 s


class Up:
    """The coordinator as an agent's upstream, on the loop; counts the calls."""

    def __init__(self, c: RunCoordinator, delay_s: float = 0.0) -> None:
        self.c, self.delay_s = c, delay_s
        self.calls: Counter[str] = Counter()

    async def deliver(self, messages):
        self.calls["deliver"] += 1
        await asyncio.sleep(self.delay_s)
        self.c.deliver(messages)

    async def get_many(self, keys):
        self.calls["get_many"] += 1
        return self.c.get_many(keys)

    async def claim(self, key):
        self.calls["claim"] += 1
        return self.c.claim(key)

    async def wait_fact(self, key, timeout_s):
        self.calls["wait_fact"] += 1
        return await self.c.wait_fact(key, timeout_s)


class Run:
    """A coordinator, ``nodes`` aggregators and ``nodes * per_node`` ranks' links."""

    def __init__(self, tmp_path, nodes: int, per_node: int, *, agents: bool = True,
                 delay_s: float = 0.0, ack_s: float = 5.0, memory_s: float = 30.0,
                 flush_s: float = FLUSH_S, **agent_kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.path = tmp_path / "events.jsonl"
        self.c = RunCoordinator(str(self.path), {"run": "t", "metrics": None})
        self.up = Up(self.c, delay_s)
        self.coordinator = Handle(self.c, self.loop)
        self.aggs = [NodeAggregator(self.up, f"n{n}") for n in range(nodes)]
        for agg in self.aggs:
            agg.outbox.flush_s = agg.reads.flush_s = flush_s
        self.agents = [Handle(agg, self.loop, **agent_kw) for agg in self.aggs]
        world = nodes * per_node
        self.links = [
            RunLink(SimpleNamespace(rank=r, node_id=f"n{r // per_node}", attempt=2,
                                    world_size=world, local_world_size=per_node),
                    self.coordinator, agent=self.agents[r // per_node] if agents else None,
                    timeouts=LinkTimeouts(ack_s=ack_s, answer_s=30.0, hold_s=5.0,
                                         memory_s=memory_s))
            for r in range(world)]

    def each_rank(self, body: Any) -> list[Any]:
        """``body(link)`` on every rank at once (a thread each); their results."""
        start = threading.Barrier(len(self.links))

        def rank(link: RunLink) -> Any:
            start.wait()
            return body(link)

        with concurrent.futures.ThreadPoolExecutor(len(self.links)) as pool:
            return list(pool.map(rank, self.links))

    def settle(self) -> None:
        for link in self.links:
            if link._delivery is not None:
                assert link._delivery.settle(10.0)

    def events(self) -> list[dict[str, Any]]:
        time.sleep(0.05)  # a straight fire-and-forget call may still be on the loop
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(5)
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(autouse=True)
def fake_ray_get(monkeypatch) -> None:
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref.result(timeout))

    def wait(refs, timeout=None):
        done, rest = concurrent.futures.wait(refs, timeout)
        return list(done), list(rest)

    monkeypatch.setattr(ray, "wait", wait)


def per_rank(events: list[dict[str, Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for e in events:
        out.setdefault(e["rank"], []).append(e["detail"])
    return out


def say(link: RunLink, n: int = 3) -> None:
    """``n`` fire-and-forget events, then one waited for."""
    for i in range(n):
        link.record("rejoined", f"{i}")
    link.record("nan_detected", f"{n}", wait=True)


# -- events -----------------------------------------------------------------------------------
def test_every_ranks_events_reach_the_coordinator_in_one_call_per_node(tmp_path):
    run = Run(tmp_path, nodes=16, per_node=8, flush_s=WIDE_FLUSH_S)
    try:
        run.each_rank(say)
        run.settle()
        events = run.events()
    finally:
        run.close()
    assert run.up.calls["deliver"] == 16  # was 128 * 4 calls
    assert run.coordinator.calls == Counter()  # nothing straight from a rank
    assert per_rank(events) == {r: ["0", "1", "2", "3"] for r in range(128)}  # once, in order
    assert all(e["attempt"] == 2 and e["node"] == f"n{e['rank'] // 8}" for e in events)


def test_without_agents_every_rank_calls_the_coordinator(tmp_path):
    run = Run(tmp_path, nodes=4, per_node=8, agents=False)
    try:
        run.each_rank(say)
        events = run.events()
    finally:
        run.close()
    assert run.coordinator.calls == Counter({"record": 32 * 4})
    assert per_rank(events) == {r: ["0", "1", "2", "3"] for r in range(32)}


def test_a_waited_event_returns_only_once_the_coordinator_has_it(tmp_path):
    run = Run(tmp_path, nodes=1, per_node=2, delay_s=0.3)
    run.aggs[0].outbox.flush_s = 0.01
    try:
        started = time.monotonic()
        run.links[0].record("stall_detected", "x", wait=True)
        took = time.monotonic() - started
        logged = [e["kind"] for e in run.events()]
    finally:
        run.close()
    assert took >= 0.3 and logged == ["stall_detected"]


def test_a_dead_agent_sends_every_event_straight_once_and_in_order(tmp_path):
    run = Run(tmp_path, nodes=2, per_node=4, dead=True)
    try:
        run.each_rank(say)
        run.settle()
        events = run.events()
    finally:
        run.close()
    assert per_rank(events) == {r: ["0", "1", "2", "3"] for r in range(8)}
    assert run.coordinator.calls["deliver"] == 8 * 4 and run.up.calls["deliver"] == 0
    assert all(link._delivery.lost for link in run.links)


def test_an_agent_that_answers_too_late_costs_no_duplicate(tmp_path):
    """The agent takes every message to the coordinator but its answers never come: each
    rank sends them straight after ``ack_s``; the coordinator acts on each once."""
    run = Run(tmp_path, nodes=2, per_node=4, ack_s=0.3, late=("deliver",))
    for agg in run.aggs:
        agg.outbox.flush_s = 0.01
    try:
        run.each_rank(say)
        run.settle()
        events = run.events()
    finally:
        run.close()
    assert run.up.calls["deliver"] >= 2 and run.coordinator.calls["deliver"] == 8 * 4
    assert per_rank(events) == {r: ["0", "1", "2", "3"] for r in range(8)}


def test_an_agent_that_dies_midway_loses_nothing(tmp_path):
    run = Run(tmp_path, nodes=1, per_node=4)
    run.aggs[0].outbox.flush_s = 0.01
    try:
        run.each_rank(lambda link: say(link, 2))
        run.agents[0].dead = True
        run.each_rank(lambda link: [link.record("restored", f"{i}") for i in range(3)])
        run.settle()
        events = run.events()
    finally:
        run.close()
    assert per_rank(events) == {r: ["0", "1", "2", "0", "1", "2"] for r in range(4)}


def test_failure_records_and_marks_of_every_rank_go_once_per_node(tmp_path):
    run = Run(tmp_path, nodes=4, per_node=8)

    def fail(link: RunLink) -> None:
        link.mark(f"cause:2:{link.ctx.rank}", "killed by rayguard: stall")
        link.put(f"diagnosis:place:2:{link.ctx.rank}", {"node": link.ctx.node_id})
        link.record_failure(RuntimeError(f"rank {link.ctx.rank} lost a peer"), 7)

    try:
        run.each_rank(fail)
        run.settle()
    finally:
        run.close()
    assert run.up.calls["deliver"] <= 2 * 4 and run.coordinator.calls == Counter()
    assert sorted(run.c.failed_ranks(2)) == list(range(32))
    assert all(run.c.get(f"cause:2:{r}") and run.c.get(f"diagnosis:place:2:{r}")
               for r in range(32))


# -- reads and claims -------------------------------------------------------------------------
def test_a_fact_every_rank_reads_is_read_once_per_node(tmp_path):
    run = Run(tmp_path, nodes=8, per_node=8)
    run.c.put(ASSIGNMENT_KEY, {"current": ["slot"]})
    try:
        got = run.each_rank(lambda link: (link.get(ASSIGNMENT_KEY), link.get("absent")))
    finally:
        run.close()
    assert got == [({"current": ["slot"]}, None)] * 64
    assert run.up.calls["get_many"] == 2 * 8  # two reads in turn: a call per node each
    assert run.coordinator.calls == Counter()


def test_one_rank_of_the_run_wins_a_claim_asked_once_per_node(tmp_path):
    run = Run(tmp_path, nodes=4, per_node=8)
    try:
        won = run.each_rank(lambda link: link.claim("choose-ckpt:2"))
        again = run.each_rank(lambda link: link.claim("choose-ckpt:2"))
    finally:
        run.close()
    assert won.count(True) == 1 and not any(again)
    assert run.up.calls["claim"] == 4 and run.coordinator.calls == Counter()


def test_reads_and_claims_go_straight_when_the_agent_is_dead(tmp_path):
    run = Run(tmp_path, nodes=2, per_node=4, dead=True)
    run.c.put("k", 1)
    try:
        got = run.each_rank(lambda link: (link.get("k"), link.claim("c")))
    finally:
        run.close()
    assert [g for g, _ in got] == [1] * 8 and [w for _, w in got].count(True) == 1
    assert run.coordinator.calls == Counter({"get": 8, "claim": 8})


# -- a resize in place ------------------------------------------------------------------------
RESIZE = {"attempt": 3, "ranks": [], "at": 1.0, "detail": "grow",
          "resize": {"old_world_size": 32, "world_size": 40, "direction": "grow"}}


def resize_calls(tmp_path, monkeypatch, agents: bool) -> tuple[Counter, Counter, list]:
    """Every kept rank of a 4-node, 32-rank group takes its place in a resize in place while
    a controller waits for their marks and publishes the go: the coordinator's calls (from
    the agents, from the ranks) and the places taken."""
    places: list[dict[str, int]] = []
    monkeypatch.setattr(live, "apply_place", places.append)
    run = Run(tmp_path, nodes=4, per_node=8, agents=agents)
    for agg in run.aggs:  # 0.5 s split one node's batch in two beside the Ray tests
        agg.outbox.flush_s = agg.reads.flush_s = 2.0
    run.c.put(live_key(2), RESIZE)

    def controller() -> None:
        keys = [left_key(2, r) for r in range(32)]
        while True:
            ask = asyncio.run_coroutine_threadsafe(call(run.c.present, (keys,)), run.loop)
            if len(ask.result(5)) == len(keys):
                break
            time.sleep(0.01)
        go = {"places": {str(r): {"world_rank": r, "world_size": 40} for r in range(32)}}
        asyncio.run_coroutine_threadsafe(call(run.c.put, (go_key(3), go)), run.loop).result(5)

    ctl = threading.Thread(target=controller)
    ctl.start()
    try:
        taken = run.each_rank(lambda link: live.take_place(link, 3, wait_s=20.0))
        ctl.join(10)
    finally:
        run.close()
    assert all(taken)
    return run.up.calls, run.coordinator.calls, places


def test_a_resizes_kept_ranks_read_and_mark_once_per_node(tmp_path, monkeypatch):
    up, straight, places = resize_calls(tmp_path, monkeypatch, agents=True)
    assert sorted(p["world_rank"] for p in places) == list(range(32))
    assert straight == Counter()  # the reads and marks were 32 each
    assert up["get_many"] == 4 and up["deliver"] == 4 and up["wait_fact"] == 4


def test_without_agents_a_resize_costs_three_calls_a_rank(tmp_path, monkeypatch):
    up, straight, _ = resize_calls(tmp_path, monkeypatch, agents=False)
    assert up == Counter()
    assert straight["get"] == 32 and straight["put"] == 32 and straight["wait_fact"] >= 32


# -- memory-tier offers -----------------------------------------------------------------------
class Ref:
    """Stands for the object reference a node's keeper returns (``keeper.hold``). In Ray a
    reference nested in a call's arguments is passed by reference, not resolved: the agent
    borrows it on its way and the coordinator gets the same reference; here the agent and
    the coordinator share the test's process, so the same object arrives."""

    def __init__(self, rank: int) -> None:
        self.rank = rank


def offer_all(run: Run, path: str = "/ckpt/step-5") -> tuple[dict[int, Ref], Counter]:
    """Every rank offers its memory copy of ``path`` at once (the coordinator counting its
    registrations per rank); the refs offered and those counts, read once every rank's
    call returned (a waited message: no settling needed)."""
    refs = {r: Ref(r) for r in range(len(run.links))}
    registered: Counter[int] = Counter()
    offer = run.c.memory_offer

    def counted(path, step, rank, node, digests, got):
        registered[rank] += 1
        offer(path, step, rank, node, digests, got)

    run.c.memory_offer = counted
    run.each_rank(lambda link: link.memory_offer(path, 5, {"w": f"d{link.ctx.rank}"},
                                                 [refs[link.ctx.rank]]))
    run.c.memory_commit(path, 5)
    return refs, registered


def assert_held(run: Run, refs: dict[int, Ref], registered: Counter,
                path: str = "/ckpt/step-5") -> None:
    assert registered == Counter({r: 1 for r in refs})  # each offer registered once
    for r, ref in refs.items():
        snap = run.c._memory.lookup(path, r)
        assert snap.refs[0] is ref and len(snap.refs) == 1  # passed on, unchanged
        assert snap.node == run.links[r].ctx.node_id and snap.digests == {"w": f"d{r}"}


def test_every_ranks_memory_offer_reaches_the_coordinator_in_one_call_per_node(tmp_path):
    run = Run(tmp_path, nodes=16, per_node=8, flush_s=WIDE_FLUSH_S)
    try:
        refs, registered = offer_all(run)
    finally:
        run.close()
    assert run.up.calls["deliver"] == 16  # was 128 memory_offer calls
    assert run.coordinator.calls == Counter()
    assert_held(run, refs, registered)


def test_without_agents_every_rank_offers_to_the_coordinator(tmp_path):
    run = Run(tmp_path, nodes=2, per_node=4, agents=False)
    try:
        refs, registered = offer_all(run)
    finally:
        run.close()
    assert run.coordinator.calls == Counter({"memory_offer": 8})
    assert_held(run, refs, registered)


def test_a_memory_offer_returns_only_once_the_coordinator_has_it(tmp_path):
    run = Run(tmp_path, nodes=1, per_node=2, delay_s=0.3)
    run.aggs[0].outbox.flush_s = 0.01
    try:
        started = time.monotonic()
        run.links[0].memory_offer("/ckpt/a", 1, {}, [Ref(0)])
        took = time.monotonic() - started
    finally:
        run.close()
    assert took >= 0.3 and run.c._memory.snapshot("/ckpt/a", 0) is not None


def test_a_dead_agent_sends_every_offer_straight_once(tmp_path):
    run = Run(tmp_path, nodes=2, per_node=4, dead=True)
    try:
        refs, registered = offer_all(run)
    finally:
        run.close()
    assert run.coordinator.calls == Counter({"deliver": 8}) and run.up.calls["deliver"] == 0
    assert all(link._delivery.lost for link in run.links)
    assert_held(run, refs, registered)


def test_an_offer_the_agent_took_unanswered_is_registered_once(tmp_path):
    """The agent takes every offer to the coordinator but never answers within the memory
    tier's timeout: each rank sends its offer straight; the coordinator knows its id."""
    run = Run(tmp_path, nodes=2, per_node=4, memory_s=0.3, late=("deliver",))
    for agg in run.aggs:
        agg.outbox.flush_s = 0.01
    try:
        refs, registered = offer_all(run)
    finally:
        run.close()
    assert run.up.calls["deliver"] >= 2 and run.coordinator.calls["deliver"] == 8
    assert_held(run, refs, registered)


# -- the parts --------------------------------------------------------------------------------
def test_an_outbox_keeps_one_call_in_flight_and_each_senders_order():
    sent: list[list[str]] = []
    in_flight = []

    async def send(batch):
        in_flight.append(1)
        assert len(in_flight) == 1
        await asyncio.sleep(0.01)
        sent.append([payload for _, _, payload in batch])
        in_flight.pop()

    async def sender(box: Outbox, name: str) -> None:
        for i in range(20):
            await box.post((EVENT, f"{name}{i}", f"{name}{i}"))
            await asyncio.sleep(0.001 * (i % 3))

    async def main() -> None:
        box = Outbox(send, flush_s=0.002)
        await asyncio.gather(*(sender(box, n) for n in "abcd"))

    asyncio.run(main())
    flat = [p for batch in sent for p in batch]
    assert sorted(flat) == sorted(f"{n}{i}" for n in "abcd" for i in range(20))
    for n in "abcd":
        assert [p for p in flat if p[0] == n] == [f"{n}{i}" for i in range(20)]
    assert len(sent) < 80  # batched


def test_an_outbox_whose_call_fails_fails_every_message_of_the_batch():
    async def send(batch):
        raise ConnectionError("the coordinator died")

    async def main() -> list:
        box = Outbox(send, flush_s=0.001)
        return await asyncio.gather(*(box.post((EVENT, str(i), i)) for i in range(5)),
                                    return_exceptions=True)

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(main()))


def test_the_coordinator_acts_on_each_message_id_once():
    seen = Delivered(keep=3)
    assert [seen.first(m) for m in ("a", "b", "a", None, None)] == [True, True, False, True,
                                                                    True]
    for m in "cde":
        seen.first(m)
    assert seen.first("a")  # forgotten past ``keep``
