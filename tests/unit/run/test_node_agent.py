"""Per-node aggregation (rayguard.run.agent.NodeAggregator) over a real coordinator object on
one event loop: every rank's contribution is counted exactly once whatever the arrival order
and batching; the coordinator hears once per node; a lost coordinator (or a lost agent,
seen from its ranks) makes every waiting rank raise instead of waiting."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.run.agent import NodeAggregator, wants_agents
from rayguard.run.coordinator import RunCoordinator


class Direct:
    """The coordinator as an upstream, in this loop (what RayUpstream does over Ray)."""

    def __init__(self, c: RunCoordinator) -> None:
        self.c = c
        self.calls: list[tuple[str, object]] = []

    async def gather_many(self, tag, world_size, values, timeout_s, keep, root):
        self.calls.append(("gather", sorted(values)))
        return await self.c.gather_many(tag, world_size, values, timeout_s, keep, root=root)

    async def wait_fact(self, key, timeout_s):
        self.calls.append(("fact", key))
        return await self.c.wait_fact(key, timeout_s)

    def summaries(self, batch):
        self.calls.append(("summaries", len(batch)))
        self.c.step_summaries(batch)


def coordinator(tmp_path) -> RunCoordinator:
    return RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})


async def run_gather(c: RunCoordinator, placement: list[int], order: list[int],
                     skew: int | None, delays: list[float]) -> tuple[list, Direct]:
    """Ranks ``order`` (rank r on node ``placement[r]``) arrive in that order, with small
    delays, each through its node's aggregator, told its node's rank count off by ``skew``
    (``None``: not told; a replacement placed elsewhere makes it wrong)."""
    up = Direct(c)
    nodes = {n: NodeAggregator(up, f"n{n}", flush_s=0.002) for n in set(placement)}
    local = {n: placement.count(n) for n in nodes}
    world = len(placement)

    async def rank(r: int, delay: float):
        await asyncio.sleep(delay)
        node = placement[r]
        told = 0 if skew is None else max(1, local[node] + skew)
        return r, await nodes[node].gather("a0:t", r, world, f"v{r}", 10.0, local=told)

    out = await asyncio.gather(*(rank(r, d) for r, d in zip(order, delays, strict=True)))
    return out, up


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_rank_is_counted_exactly_once_whatever_the_arrival_order(tmp_path_factory, data):
    world = data.draw(st.integers(1, 40))
    per_node = data.draw(st.integers(1, 8))
    placement = [r // per_node for r in range(world)]
    order = data.draw(st.permutations(list(range(world))))
    delays = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.004]), min_size=world,
                                max_size=world))
    skew = data.draw(st.sampled_from([None, 0, 0, 1, -1]))
    c = coordinator(tmp_path_factory.mktemp("agg"))
    out, up = asyncio.run(run_gather(c, placement, order, skew, delays))
    expected = [f"v{r}" for r in range(world)]
    assert all(result == expected for _, result in out)
    sent = [ranks for kind, ranks in up.calls if kind == "gather"]
    assert sorted(r for ranks in sent for r in ranks) == list(range(world))  # once each
    assert c._gathers.calls == world


def test_the_coordinator_hears_once_per_node_when_every_local_rank_is_in(tmp_path):
    c = coordinator(tmp_path)
    placement = [r // 8 for r in range(1024)]
    order = list(range(1024))
    random.Random(3).shuffle(order)
    out, up = asyncio.run(run_gather(c, placement, order, 0, [0.0] * 1024))
    assert len(out) == 1024 and len([k for k, _ in up.calls if k == "gather"]) == 128


def test_only_the_node_of_a_gathers_root_gets_every_value(tmp_path):
    c = coordinator(tmp_path)
    boom = ValueError("rank 5 could not write")

    async def run() -> list:
        up = Direct(c)
        nodes = [NodeAggregator(up, f"n{n}") for n in range(3)]
        return await asyncio.gather(*(
            nodes[r // 2].gather("a0:records", r, 6, boom if r == 5 else f"rec{r}", 10.0,
                                 local=2, root=0) for r in range(6)))

    out = asyncio.run(run())
    assert out[0] == out[1] == ["rec0", "rec1", "rec2", "rec3", "rec4", boom]
    assert out[2] == out[5] == [None, None, None, None, None, boom]  # the errors only


def test_a_fact_is_polled_once_per_node_for_all_its_waiting_ranks(tmp_path):
    c = coordinator(tmp_path)

    async def run() -> tuple[list, Direct]:
        up = Direct(c)
        agg = NodeAggregator(up, "n0", hold_s=5.0)
        waits = [asyncio.ensure_future(agg.wait_fact("diagnosis:0", 5.0)) for _ in range(8)]
        await asyncio.sleep(0.01)
        c.put("diagnosis:0", True)
        return await asyncio.gather(*waits), up

    values, up = asyncio.run(run())
    assert values == [True] * 8 and up.calls == [("fact", "diagnosis:0")]


def test_step_summaries_of_a_node_go_in_one_call(tmp_path):
    c = coordinator(tmp_path)

    async def run() -> Direct:
        up = Direct(c)
        agg = NodeAggregator(up, "n0", summary_every_s=0.01)
        for rank in range(8):
            agg.summary({"rank": rank, "attempt": 0, "steps": 1, "time": 1.0})
        await asyncio.sleep(0.05)
        return up

    assert asyncio.run(run()).calls == [("summaries", 8)]


class Lost:
    """A coordinator (or the path to it) that dies while a gather waits."""

    async def gather_many(self, *args):
        await asyncio.sleep(0.01)
        raise ConnectionError("the coordinator died")


def test_a_lost_upstream_fails_every_waiting_rank_instead_of_a_hang():
    async def run() -> list:
        agg = NodeAggregator(Lost(), "n0", flush_s=0.001)  # type: ignore[arg-type]
        return await asyncio.wait_for(asyncio.gather(
            *(agg.gather("a0:t", r, 16, r, 600.0, local=4) for r in range(4)),
            return_exceptions=True), 10)

    out = asyncio.run(run())
    assert len(out) == 4 and all(isinstance(e, ConnectionError) for e in out)


@pytest.mark.parametrize("world,setting,expected", [
    (2, None, False), (255, None, False), (256, None, True), (16384, "0", False),
    (2, "1", True), (2, "yes", False)])
def test_when_ranks_talk_through_node_agents(world, setting, expected):
    assert wants_agents(world, setting) is expected


def test_a_nodes_summaries_make_one_steps_event_that_names_its_ranks(tmp_path):
    import json

    c = coordinator(tmp_path)
    c.open_attempt("restart")
    from rayguard.observe.steps import StepTimer

    def summary(rank: int) -> dict:
        timer = StepTimer(interval_s=3600.0)
        for step in range(1, 6 + rank):
            timer.on_report(step, {"loss": 1.0}, 0.0)
        return {**timer.take(), "rank": rank, "attempt": 0, "node": "n0", "time": 10.0}

    c.step_summaries([summary(r) for r in (9, 8, 10)])
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    steps = [e for e in lines if e["kind"] == "steps"]
    assert len(steps) == 1 and steps[0]["rank"] == 8 and steps[0]["last_step"] == 13
    assert steps[0]["ranks"] == [8, 9, 10] and steps[0]["ranks_last_step"] == 15
    assert c.high_step() == 15


def test_a_ranks_summaries_of_one_batch_reach_the_coordinator_as_one(tmp_path):
    """Two summaries of each of a node's ranks within one interval go as one per rank (and
    attempt): the coordinator's steps event covers the lead rank's whole batch, where it
    logged only its first summary and named the rank twice."""
    import json

    c = coordinator(tmp_path)
    c.open_attempt("restart")

    def summary(rank: int, attempt: int, steps: range) -> dict:  # a StepTimer's, 5 reports
        return {"reports": len(steps), "intervals": len(steps), "step_time_sum_s": 0.5,
                "step_time_max_s": 0.1, "blocked_sum_s": 0.0, "blocked_max_s": 0.0,
                "first_step": steps[0], "last_step": steps[-1], "first_time": float(steps[0]),
                "last_time": float(steps[-1]), "metric": "loss", "samples": [[steps[0], 1.0]],
                "rank": rank, "attempt": attempt, "node": "n0", "time": float(steps[-1])}

    async def run() -> Direct:
        up = Direct(c)
        agg = NodeAggregator(up, "n0", summary_every_s=0.02)
        for first in (1, 6):
            for rank in (0, 1):
                agg.summary(summary(rank, 1, range(first, first + 5)))
        agg.summary(summary(1, 2, range(1, 3)))  # rank 1's next attempt: its own summary
        await asyncio.sleep(0.1)
        return up

    assert asyncio.run(run()).calls == [("summaries", 3)]
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    steps = [e for e in lines if e["kind"] == "steps"]
    assert [(e["rank"], e["first_step"], e["last_step"], e["reports"]) for e in steps] == [
        (0, 1, 10, 10)]
    assert steps[0]["ranks"] == [0, 1, 1] and steps[0]["ranks_last_step"] == 10


def test_the_runs_last_event_comes_after_the_summaries_its_agents_hold(tmp_path):
    # with node agents, step summaries wait up to 10 s at a node and its relay: the run's
    # end sends them first, so its last seconds of steps are in the log before `finished`
    import asyncio
    import json

    from rayguard.events import make_event
    from rayguard.run.coordinator import RunCoordinator

    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    order: list[str] = []

    class Ref:
        def __init__(self, fn):
            self.fn = fn

        def __await__(self):
            async def go():
                return self.fn()
            return go().__await__()

    class Agent:
        def __init__(self, held):
            self.held = held
            self.flush = self

        def remote(self):
            def send():
                order.append("flushed")
                c.step_summaries(self.held)
            return Ref(send)

    summary = {"rank": 0, "attempt": 0, "last_step": 5, "node": "n1", "time": 1.0,
               "steps": 5, "step_s": [0.1] * 5}
    c._agents = {"n1": Agent([summary]), "n2": Agent([])}
    finished = make_event("finished", "run finished")
    finished["time"] -= 1.0  # made before the flush: the summaries it waited for are newer
    asyncio.run(c.end(finished))
    assert order == ["flushed", "flushed"]
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds == ["steps", "finished"]  # rank 0's 5 steps, then the end
    # and read by time, as every reader does: the end is still last
    from rayguard.events import read as read_events

    assert [e["kind"] for e in read_events(tmp_path / "events.jsonl")] == ["steps", "finished"]
