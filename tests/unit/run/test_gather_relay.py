"""Gather contributions relayed above the nodes (rayguard.run.gather_relay), over a real
coordinator object on one event loop: a group's node batches reach the coordinator in one
call; a relay that is lost (its call raises, its answer never comes, it stops answering
pings) leaves its group's nodes to send their batches straight, and every contribution
counts once whatever arrives twice and in whatever order; an agent that dies mid-gather
ends the attempt's waits through the normal release, never a hang."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.run.agent import NodeAggregator
from rayguard.run.coordinator import RunCoordinator
from rayguard.run.gather_relay import GroupGather, RelayedGathers, group_due
from rayguard.run.relay import RelayingUpstream
from rayguard.run.waits import GatherBoard

MODES = ("ok", "refused", "answer lost", "silent")
"""How a node's relay behaves towards it: answers; is gone before the node's call (the call
raises: a dead actor); takes the batch on and dies before answering; takes it on and never
answers again (a ping goes unanswered)."""


class Direct:
    """The coordinator as a node's straight way and a relay's upstream, in this loop (what
    RayUpstream does over Ray, by value)."""

    def __init__(self, c: RunCoordinator) -> None:
        self.c = c
        self.calls: list[tuple[str, list]] = []

    async def gather_many(self, tag, world_size, values, timeout_s, keep, root, batch=None,
                          by_ref=True):
        self.calls.append(("node", [batch]))
        return await self.c.gather_many(tag, world_size, values, timeout_s, keep, root=root,
                                        batch=batch)

    async def resolve(self, answer, again=None):
        return answer

    async def gather_group(self, tag, world_size, batches, timeout_s, keep, full, errors):
        self.calls.append(("group", sorted(batches)))
        return await self.c.gather_group(tag, world_size, batches, timeout_s, keep, full, errors)


def coordinator(tmp_path) -> RunCoordinator:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt("restart")
    return c


def link(group: GroupGather, mode: str):
    """The node's call to its relay (a Ray call of the relay agent), behaving as ``mode``,
    and the relay's ping."""
    held: set[asyncio.Task] = set()

    async def call(*args):
        if mode == "refused":
            raise ConnectionError("the relay agent died")
        task = asyncio.ensure_future(group.gather(*args))
        held.add(task)
        if mode == "silent":
            await asyncio.sleep(3600)
        answer = await task
        if mode == "answer lost":
            raise ConnectionError("the relay agent died before it answered")
        return answer

    async def ping():
        if mode == "silent":
            await asyncio.sleep(3600)
        return True

    return call, ping


class Run:
    """``nodes`` aggregators in groups of ``group`` (the first of each relays), node ``n``'s
    link to its relay behaving as ``modes[n]``."""

    def __init__(self, c: RunCoordinator, nodes: int, group: int, modes: list[str]) -> None:
        self.up = Direct(c)
        self.groups: dict[int, GroupGather] = {}
        self.sides: dict[int, RelayedGathers] = {}
        self.aggs: dict[int, NodeAggregator] = {}
        for n in range(nodes):
            lead = n - n % group
            if lead == n:
                relay = self.groups[n] = GroupGather(self.up.gather_group, flush_s=0.005)
                for m in range(n, min(n + group, nodes)):
                    relay.join(f"n{m}")
                side = RelayedGathers(self.up, relay.gather, node=f"n{n}")
            else:
                call, ping = link(self.groups[lead], modes[n])
                side = RelayedGathers(self.up, call, node=f"n{n}", ping=ping, probe_s=0.005)
            self.sides[n] = side
            self.aggs[n] = NodeAggregator(RelayingUpstream(self.up, lambda batch: None, side),
                                          f"n{n}", flush_s=0.002)

    def straight(self) -> set[str]:
        """The batch ids that went straight to the coordinator."""
        return {b for kind, ids in self.up.calls if kind == "node" for b in ids}


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_every_contribution_counts_once_whatever_the_relays_and_the_order(tmp_path_factory,
                                                                          data):
    per_node = data.draw(st.integers(1, 4), label="ranks per node")
    world = data.draw(st.integers(1, 40), label="world")
    nodes = (world + per_node - 1) // per_node
    group = data.draw(st.integers(1, 5), label="nodes per group")
    modes = data.draw(st.lists(st.sampled_from(MODES), min_size=nodes, max_size=nodes))
    order = data.draw(st.permutations(list(range(world))))
    delays = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.003, 0.012]), min_size=world,
                                max_size=world))
    keep = data.draw(st.booleans(), label="keep")
    root = data.draw(st.sampled_from([None, 0]), label="root")
    c = coordinator(tmp_path_factory.mktemp("relay"))

    async def run() -> tuple[Run, dict[int, list]]:
        sim = Run(c, nodes, group, modes)

        async def rank(r: int, delay: float):
            await asyncio.sleep(delay)
            node = r // per_node
            local = min(per_node, world - node * per_node)
            return r, await sim.aggs[node].gather("a1:t", r, world, f"v{r}", 10.0, keep,
                                                  local, root)

        out = await asyncio.wait_for(asyncio.gather(
            *(rank(r, d) for r, d in zip(order, delays, strict=True))), 30)
        return sim, dict(out)

    sim, out = asyncio.run(run())
    full = [f"v{r}" for r in range(world)]
    for r, answer in out.items():  # a rank in a batch with the root's may get every value
        assert answer == full or (root not in (None, r) and answer == [None] * world), r
    assert c._gathers.calls == world  # each rank's contribution counted once
    assert c._gathers.pending() == {}
    straight = sim.straight()
    for n in range(nodes):  # a node goes straight only when its relay was lost to it
        assert (f"n{n}#1" in straight) == (n % group != 0 and modes[n] != "ok"), n


def test_a_groups_nodes_reach_the_coordinator_in_one_call_with_their_answers(tmp_path):
    """64 nodes in groups of 32, every node's ranks in at once: two calls reach the
    coordinator (2,048 nodes: 64, was 2,048); the root's node gets every record, the others
    the errors only, as without the relay."""
    c = coordinator(tmp_path)
    boom = ValueError("rank 77 could not write")

    async def run() -> tuple[Run, list]:
        sim = Run(c, 64, 32, ["ok"] * 64)
        return sim, await asyncio.gather(*(
            sim.aggs[r // 4].gather("a1:commit:records", r, 256,
                                    boom if r == 77 else f"rec{r}", 10.0, False, 4, 0)
            for r in range(256)))

    sim, out = asyncio.run(run())
    assert [kind for kind, _ in sim.up.calls] == ["group", "group"]
    assert [len(ids) for _, ids in sim.up.calls] == [32, 32]
    records = [boom if r == 77 else f"rec{r}" for r in range(256)]
    assert out[0] == out[3] == records
    errors = [boom if r == 77 else None for r in range(256)]
    assert out[4] == out[255] == errors
    assert c._gathers.calls == 256 and sum(g.sent for g in sim.groups.values()) == 2


def test_a_relay_lost_mid_gather_leaves_its_group_to_go_straight_and_complete(tmp_path):
    """The relay takes nodes 0 and 1 on (sent on in one call), then dies: node 1's call
    raises (its batch goes straight: a second copy, joined once), the late nodes 2 and 3
    find it gone and go straight; the gather completes for every node but the relay's own
    (whose ranks' calls raise, their agent dead), and the nodes go straight from then on."""
    c = coordinator(tmp_path)
    dead = asyncio.Event

    async def run() -> tuple[Run, list]:
        sim = Run(c, 4, 4, ["ok"] * 4)
        relay, gone = sim.groups[0], dead()
        for n in (1, 2, 3):
            async def call(*args, _relay=relay):
                if gone.is_set():
                    raise ConnectionError("the relay agent died")
                task = asyncio.ensure_future(_relay.gather(*args))
                await asyncio.wait({task, asyncio.ensure_future(gone.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                if gone.is_set():
                    raise ConnectionError("the relay agent died")
                return task.result()
            sim.sides[n].relay = call

        async def rank(r: int, delay: float):
            await asyncio.sleep(delay)
            return await sim.aggs[r // 2].gather("a1:setup", r, 8, f"v{r}", 10.0, True, 2)

        own = [asyncio.ensure_future(rank(r, 0.0)) for r in (0, 1)]
        early = [asyncio.ensure_future(rank(r, 0.0)) for r in (2, 3)]
        await asyncio.sleep(0.03)  # the relay's window: nodes 0 and 1 sent on
        assert [ids for _, ids in sim.up.calls] == [["n0#1", "n1#1"]]
        gone.set()
        for task in own:  # the relay's own ranks: their agent died with it
            task.cancel()
        late = [asyncio.ensure_future(rank(r, 0.0)) for r in range(4, 8)]
        return sim, await asyncio.wait_for(asyncio.gather(*early, *late), 10)

    sim, out = asyncio.run(run())
    assert out == [[f"v{r}" for r in range(8)]] * 6
    assert sim.straight() == {"n1#1", "n2#1", "n3#1"}
    assert c._gathers.calls == 8  # node 1's batch arrived twice, counted once
    assert all(sim.sides[n].relay is None for n in (1, 2, 3))


def test_a_relay_that_no_longer_answers_is_left_after_a_ping(tmp_path):
    """A relay whose node is gone before Ray says so: the call neither answers nor raises;
    the node's ping goes unanswered, and its batch goes straight."""
    c = coordinator(tmp_path)

    async def run() -> list:
        sim = Run(c, 2, 2, ["ok", "ok"])

        async def hung(*args):
            await asyncio.sleep(3600)

        async def no_answer():
            await asyncio.sleep(3600)

        sim.sides[1].relay, sim.sides[1].ping = hung, no_answer
        return await asyncio.wait_for(asyncio.gather(
            *(sim.aggs[r // 2].gather("a1:t", r, 4, r, 10.0, False, 2) for r in range(4))), 5)

    assert asyncio.run(run()) == [[0, 1, 2, 3]] * 4
    assert c._gathers.calls == 4


def test_a_slow_gather_keeps_a_relay_that_answers_its_pings(tmp_path):
    """A relay that waits with its group for a late peer is not lost: it answers pings."""
    c = coordinator(tmp_path)

    async def run() -> Run:
        sim = Run(c, 3, 2, ["ok"] * 3)
        sim.sides[1].probe_s = 0.002
        first = [sim.aggs[r].gather("a1:t", r, 3, r, 10.0, False, 1) for r in (0, 1)]
        waiting = asyncio.ensure_future(asyncio.gather(*first))
        await asyncio.sleep(0.05)  # many probes while node 2 is late
        assert not waiting.done()
        await sim.aggs[2].gather("a1:t", 2, 3, 2, 10.0, False, 1)
        assert await waiting == [[0, 1, 2]] * 2
        return sim

    sim = asyncio.run(run())
    assert sim.sides[1].relay is not None and sim.straight() == set()


def test_a_dead_relay_before_its_own_nodes_batch_ends_in_the_release_not_a_hang(tmp_path):
    """The relay dies holding nothing of its own node (its ranks' calls raise): its group's
    other nodes go straight and wait at the coordinator, where the recovery's release (a
    live attempt opened for the lost ranks) ends every wait with None: the link raises
    PeersLostError, the attempt fails cleanly into recovery."""
    c = coordinator(tmp_path)

    async def run() -> list:
        sim = Run(c, 3, 3, ["ok", "refused", "refused"])
        waits = [asyncio.ensure_future(sim.aggs[r].gather("a1:setup", r, 3, r, 600.0, True, 1))
                 for r in (1, 2)]
        await asyncio.sleep(0.02)
        assert sim.straight() == {"n1#1", "n2#1"} and not any(w.done() for w in waits)
        c.open_attempt("live", failed=1, replaced=[0], detail="node 0 lost")
        return await asyncio.wait_for(asyncio.gather(*waits), 5)

    assert asyncio.run(run()) == [None, None]


def test_a_member_that_never_comes_does_not_hold_its_groups_batches(tmp_path):
    """A member's agent died before its node's batch: the relay sends the others on after
    its window (they wait at the coordinator, not at the relay), and the release ends them."""
    c = coordinator(tmp_path)

    async def run() -> list:
        sim = Run(c, 3, 3, ["ok"] * 3)
        waits = [asyncio.ensure_future(sim.aggs[r].gather("a1:c", r, 3, r, 600.0, False, 1))
                 for r in (0, 1)]
        await asyncio.sleep(0.05)
        assert c._gathers.pending() == {"a1:c": 2}  # at the coordinator
        c.open_attempt("live", failed=1, replaced=[2])
        return await asyncio.wait_for(asyncio.gather(*waits), 5)

    assert asyncio.run(run()) == [None, None]


def test_a_lost_coordinator_fails_every_rank_of_the_group_instead_of_a_hang(tmp_path):
    class Lost(Direct):
        async def gather_many(self, *args):
            raise ConnectionError("the coordinator died")

        async def gather_group(self, *args):
            await asyncio.sleep(0.01)
            raise ConnectionError("the coordinator died")

    async def run() -> list:
        up = Lost(coordinator(tmp_path))
        relay = GroupGather(up.gather_group, flush_s=0.005)
        sides = [RelayedGathers(up, relay.gather, node="n0"),
                 RelayedGathers(up, relay.gather, node="n1", ping=lambda: asyncio.sleep(0))]
        aggs = [NodeAggregator(s, f"n{n}", flush_s=0.001) for n, s in enumerate(sides)]
        return await asyncio.wait_for(asyncio.gather(
            *(aggs[r // 2].gather("a1:t", r, 4, r, 600.0, local=2) for r in range(4)),
            return_exceptions=True), 10)

    out = asyncio.run(run())
    assert len(out) == 4 and all(isinstance(e, ConnectionError) for e in out)


@pytest.mark.parametrize("order", [("relay", "own"), ("own", "relay")])
def test_the_board_joins_a_batch_once_whichever_copy_comes_first(order):
    """The relay's copy and the node's own, in either order, before or after the gather
    completes: counted once, answered with the gather's values."""

    async def run() -> list:
        board = GatherBoard()
        copies = {"relay": {"n0#1": {0: "a", 1: "b"}, "n1#1": {2: "c"}},
                  "own": {"n1#1": {2: "c"}}}
        first = board.join_batches("a1:t", 4, copies[order[0]])
        second = board.join_batches("a1:t", 4, copies[order[1]])
        assert board.calls == 3 and not first.done()
        last = board.join("a1:t", 4, {3: "d"}, batch="n2#1")
        late = board.join("a1:t", 4, {2: "c"}, batch="n1#1")  # a copy after it completed
        out = [await f for f in (first, second, last, late)]
        assert board.calls == 4 and board.pending() == {}
        return out

    assert asyncio.run(run()) == [["a", "b", "c", "d"]] * 4


def test_a_tag_used_again_with_new_batches_is_a_new_gather():
    async def run() -> None:
        board = GatherBoard()
        assert await board.join("a1:t", 1, {0: "x"}, batch="n0#1") == ["x"]
        again = board.join("a1:t", 1, {0: "y"}, batch="n0#2")
        assert await again == ["y"]

    asyncio.run(run())


@pytest.mark.parametrize("seen,members,due", [
    ({"n0"}, {"n0", "n1"}, False), ({"n0", "n1"}, {"n0", "n1"}, True),
    ({"n0", "n1", "n9"}, {"n0", "n1"}, True)])
def test_a_relay_sends_when_every_node_of_its_group_is_in(seen, members, due):
    assert group_due(seen, members) is due
