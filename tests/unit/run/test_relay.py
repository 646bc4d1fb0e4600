"""Step summaries relayed above the nodes (rayguard.run.relay), over a real coordinator
object on one event loop: a group's node batches reach the coordinator in one call and are
still logged one steps event per node; a relay that fails sends nothing astray: the node
sends its own straight to the coordinator from then on."""

from __future__ import annotations

import asyncio
import json

import pytest

from rayguard.run.agent import NodeAggregator
from rayguard.run.coordinator import RunCoordinator
from rayguard.run.relay import RelayingUpstream, RelaySender, SummaryRelay, relay_of


class Direct:
    """The coordinator as an upstream, in this loop (what RayUpstream does over Ray)."""

    def __init__(self, c: RunCoordinator) -> None:
        self.c = c
        self.calls: list[tuple[str, int]] = []

    def summaries(self, batch):
        self.calls.append(("summaries", len(batch)))
        self.c.step_summaries(batch)

    def summaries_nodes(self, batches):
        self.calls.append(("nodes", len(batches)))
        self.c.step_summaries_nodes(batches)


def _summary(rank: int) -> dict:
    return {"reports": 5, "intervals": 5, "step_time_sum_s": 0.5, "step_time_max_s": 0.1,
            "blocked_sum_s": 0.0, "blocked_max_s": 0.0, "first_step": 1, "last_step": 5,
            "first_time": 1.0, "last_time": 5.0, "metric": "loss", "samples": [[1, 1.0]],
            "rank": rank, "attempt": 1, "node": f"n{rank // 8}", "time": 5.0}


def _steps(tmp_path) -> list[dict]:
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    return [e for e in lines if e["kind"] == "steps"]


@pytest.mark.parametrize("index,lead", [(0, None), (1, 0), (31, 0), (32, None), (33, 32),
                                        (2047, 2016)])
def test_the_first_agent_of_each_32_relays_its_group(index, lead):
    assert relay_of(index) == lead


def test_a_groups_node_batches_reach_the_coordinator_in_one_call(tmp_path):
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt("restart")
    up = Direct(c)

    async def run() -> SummaryRelay:
        relay = SummaryRelay(up.summaries_nodes, every_s=0.02)
        nodes = [NodeAggregator(RelayingUpstream(up, relay.add), f"n{n}", summary_every_s=0.01)
                 for n in range(3)]
        for rank in range(24):
            nodes[rank // 8].summary(_summary(rank))
        await asyncio.sleep(0.2)
        return relay

    assert asyncio.run(run()).sent == 1
    assert up.calls == [("nodes", 3)]
    assert [(e["rank"], e["node"], e["ranks"]) for e in _steps(tmp_path)] == [
        (8 * n, f"n{n}", list(range(8 * n, 8 * n + 8))) for n in range(3)]
    assert c.high_step() == 5


def test_a_node_whose_relay_fails_sends_its_own_to_the_coordinator(tmp_path):
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt("restart")
    up = Direct(c)
    tries: list[int] = []

    async def gone(batch):  # the relay agent's node is lost: the call raises
        tries.append(len(batch))
        raise ConnectionError("the relay agent died")

    async def run() -> None:
        sender = RelaySender(gone, up.summaries)
        agg = NodeAggregator(RelayingUpstream(up, sender.send), "n0", summary_every_s=0.01)
        for _ in range(2):  # two intervals: the relay is tried once, then left
            for rank in range(8):
                agg.summary(_summary(rank))
            await asyncio.sleep(0.1)

    asyncio.run(run())
    assert tries == [8] and up.calls == [("summaries", 8), ("summaries", 8)]
    assert len(_steps(tmp_path)) == 2
