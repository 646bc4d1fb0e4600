"""The node agent: one per node and run, the node's one line to the run's coordinator.

A large run's ranks do not each talk to the coordinator for what every rank does at once:
a rank on a node with an agent sends its gather contributions, its watched facts and its
step summaries to the agent on its own node, and the agent talks to the coordinator once
per node (:class:`NodeAggregator`):

* a **gather**: the node's ranks' values are batched (sent when every local rank is in, or
  ``flush_s`` after the first), and the node batches of 32 nodes go on in one call, through
  the node that relays the group (:mod:`rayguard.run.gather_relay`; straight to the
  coordinator, ``gather_many``, when that relay is lost); the coordinator puts the answer
  into the object store once and every node fetches it once;
* a **fact** a rank waits for (a hang diagnosis opening, a live-recovery notice): one long
  poll per node, its answer handed to every local rank that waits;
* **step summaries**: sent in one call per node every ``summary_every_s``, a rank's
  summaries of one batch merged into one (:func:`rayguard.observe.steps.merge_summaries`),
  through the node's relay: one call per 32 nodes reaches the coordinator
  (:mod:`rayguard.run.relay`);
* **hang-diagnosis answers**: the node's ranks' answers in one call (batched as a gather);
* **messages** (events, facts a rank leaves, failure records, memory-tier offers): one call
  per node with one in flight, each rank's call answered once the coordinator has its
  message (:mod:`rayguard.run.outbox`); a rank sends one straight when its agent did not
  take it;
* **reads and claims**: a fact as it is now, read once per node for the keys its ranks ask
  within a few milliseconds; a claim asked once per node; the memory tier's look-ups and
  peer copies, one call per node for a checkpoint's (:mod:`rayguard.run.node_asks`).

What the coordinator receives then grows with nodes, not ranks. What stays per rank,
straight to the coordinator, is what one rank does alone: rank 0's attempt, progress,
rejections and highest step, the hang diagnosis' opening and decision, and the memory
tier's commit (:mod:`rayguard.run.memory_link`).

The agent is an actor created by the coordinator (which owns it, so it lives as long as
the run, not as any worker), pinned to its node, named so that a rank finds it through
Ray's registry without asking the coordinator. An agent that dies (its node, or the
process) makes every call of its ranks raise: their attempt fails into the normal
recovery, never a silent wait. Runs of fewer than :data:`AGENT_MIN_WORLD` ranks go
straight to the coordinator, which serves them with no agent process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rayguard.exceptions import RayGuardError
from rayguard.observe.steps import merge_summaries
from rayguard.run.gather_relay import GroupGather, RelayedGathers
from rayguard.run.node_asks import MEMORY_FLUSH_S, NodeAsks, NodeClaims, NodeReads
from rayguard.run.outbox import Outbox
from rayguard.run.relay import RelayingUpstream, RelaySender, SummaryRelay
from rayguard.run.upstream import RayUpstream, Upstream
from rayguard.run.waits import MAX_WAITERS, bounded

logger = logging.getLogger("rayguard")

AGENT_MIN_WORLD = 256
"""The world size from which ranks talk to the coordinator through their node's agent
(``RAYGUARD_NODE_AGENTS=1``: always; ``0``: never)."""
FLUSH_S = 0.005
"""How long a node's gather batch waits for more local ranks after its first arrival
(sent at once when every local rank is in)."""
SUMMARY_EVERY_S = 5.0
"""How often a node's step summaries go to the coordinator, in one call (a rank sends its
own every 5 s by default, so this adds at most one interval to the straggler rule's 60 s
window; the coordinator then hears nodes/5 summary calls a second)."""
HOLD_S = 30.0
"""The long poll of a watched fact (the coordinator answers at once when it appears)."""


@dataclass
class _Batch:
    world_size: int
    timeout_s: float
    keep: bool
    result: asyncio.Future[Any]
    values: dict[int, Any] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    full: bool = False
    """Whether a rank of the batch needs every value (not only the errors)."""
    sink: Callable[[dict[int, Any]], Any] | None = None
    """Where the batch goes instead of the coordinator's gather (its answer: ``None``)."""


class NodeAggregator:
    """One node's aggregation point (the :class:`NodeAgent` actor's body, or an object in
    a benchmark's process); call from one event loop."""

    def __init__(self, upstream: Upstream, node: str, *, flush_s: float = FLUSH_S,
                 summary_every_s: float = SUMMARY_EVERY_S, hold_s: float = HOLD_S) -> None:
        self.upstream = upstream
        self.node = node
        self.flush_s = flush_s
        self.summary_every_s = summary_every_s
        self.hold_s = hold_s
        self._batches: dict[str, _Batch] = {}
        self._facts: dict[str, asyncio.Future[Any]] = {}
        self._summaries: list[dict[str, Any]] = []
        self._summary_of: dict[tuple[Any, Any], int] = {}  # (rank, attempt) -> its place
        self._summary_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sent = 0
        """Calls made to the coordinator (gathers, fact polls, summary batches)."""
        self.outbox = Outbox(lambda batch: self.upstream.deliver(batch))
        self.reads = NodeReads(lambda keys: self.upstream.get_many(keys))
        self.claims = NodeClaims(lambda key: self.upstream.claim(key))
        self.lookups = NodeAsks(lambda path, ranks: self.upstream.memory_lookup_many(path, ranks),
                               flush_s=MEMORY_FLUSH_S)
        self.peer_copies = NodeAsks(lambda job, ranks: self.upstream.memory_copy_to_peer_many(
            job[0], ranks, *job[1:]), flush_s=MEMORY_FLUSH_S)

    @property
    def calls(self) -> int:
        """Every call made to the coordinator (:attr:`sent`, messages, reads, claims, the
        memory tier's look-ups and peer copies)."""
        return (self.sent + self.outbox.sent + self.reads.sent + self.claims.sent
                + self.lookups.sent + self.peer_copies.sent)

    # -- gathers ---------------------------------------------------------------------------
    async def gather(self, tag: str, rank: int, world_size: int, value: Any,
                     timeout_s: float = 1800.0, keep: bool = False, local: int = 0,
                     root: int | None = None, sink: Callable[[dict[int, Any]], Any] | None = None
                     ) -> list[Any] | None:
        """Every rank's value for ``tag`` (the coordinator's ``gather``, one call per node);
        ``local``: how many ranks of this node join (0: unknown, the batch waits
        ``flush_s``); ``root``: see the coordinator's ``gather`` (the node gets every value
        when one of its ranks needs them). Raises what the call to the coordinator raised."""
        loop = asyncio.get_running_loop()
        batch = self._batches.get(tag)
        if batch is None:
            batch = self._batches[tag] = _Batch(int(world_size), timeout_s, keep,
                                                loop.create_future(), sink=sink)
            batch.timer = loop.call_later(self.flush_s, self._flush, tag)
        batch.values[rank] = value
        batch.full = batch.full or root is None or root == rank
        if local and len(batch.values) >= local:
            self._flush(tag)
        return await bounded(batch.result, timeout_s, shared=True)

    def _flush(self, tag: str) -> None:
        batch = self._batches.pop(tag, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        self._spawn(self._forward(tag, batch))

    async def _forward(self, tag: str, batch: _Batch) -> None:
        self.sent += 1
        try:
            if batch.sink is not None:
                result = await batch.sink(batch.values)
            else:
                result = await self.upstream.gather_many(tag, batch.world_size, batch.values,
                                                         batch.timeout_s, batch.keep,
                                                         None if batch.full else -1)
        except Exception as exc:  # the coordinator lost: every waiting rank raises it
            if not batch.result.done():
                batch.result.set_exception(exc)
            return
        if not batch.result.done():
            batch.result.set_result(result)

    # -- facts -----------------------------------------------------------------------------
    async def wait_fact(self, key: str, timeout_s: float) -> Any:
        """The fact ``key`` once there (``None`` after ``timeout_s``): one long poll of the
        coordinator per node, whatever number of local ranks wait. A fact once seen is
        answered from here (the facts waited for are written once)."""
        fut = self._facts.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None
                                           or fut.result() is None)):
            fut = self._facts[key] = self._spawn(self._poll(key))
        return await bounded(fut, timeout_s, shared=True)

    async def _poll(self, key: str) -> Any:
        self.sent += 1
        return await self.upstream.wait_fact(key, self.hold_s)

    # -- messages, reads and claims (rayguard/run/outbox.py, rayguard/run/node_asks.py) ----
    async def deliver(self, kind: str, mid: str, payload: Any) -> None:
        """A rank's message, sent with the node's others; returns once the coordinator has
        it (raises what the call to the coordinator raised)."""
        await self.outbox.post((kind, mid, payload))

    async def read(self, key: str) -> Any:
        """The fact ``key`` as it is now, read with the node's other reads."""
        return await self.reads.read(key)

    async def claim(self, key: str) -> bool:
        """Whether the asking rank is the run's first to claim ``key`` (once per node)."""
        return await self.claims.claim(key)

    async def memory_lookup(self, path: str, rank: int) -> Any:
        """The coordinator's ``memory_lookup``, asked with the node's other ranks'."""
        return await self.lookups.ask(path, rank)

    async def memory_copy_to_peer(self, path: str, rank: int, world_size: int,
                                  wait_s: float, timeout_s: float) -> str | None:
        """The coordinator's ``memory_copy_to_peer``, asked with the node's other ranks'."""
        return await self.peer_copies.ask((path, world_size, wait_s, timeout_s), rank)

    # -- hang-diagnosis answers -------------------------------------------------------------
    async def answer_diagnosis(self, attempt: int, rank: int, answer: dict[str, Any],
                               local: int = 0) -> None:
        """A rank's answer to the attempt's hang diagnosis, sent with its node's others
        (when every local rank answered, or ``flush_s`` after the first); returns once sent."""
        await self.gather(f"diagnosis-answers:{attempt}", rank, 0, answer, local=local,
                          sink=lambda values: self.upstream.answer_diagnosis_many(attempt, values))

    # -- step summaries --------------------------------------------------------------------
    def summary(self, summary: dict[str, Any]) -> None:
        """A rank's step summary, sent with the node's others within ``summary_every_s``
        (merged into the rank's summary of the same attempt already waiting: the
        coordinator's work per batch is per rank, not per summary)."""
        key = (summary.get("rank"), summary.get("attempt"))
        at = self._summary_of.get(key)
        if at is None or key[0] is None:
            self._summary_of[key] = len(self._summaries)
            self._summaries.append(summary)
        else:
            self._summaries[at] = merge_summaries(self._summaries[at], summary)
        if self._summary_timer is None:
            self._summary_timer = asyncio.get_running_loop().call_later(
                self.summary_every_s, self.flush_summaries)

    def flush_summaries(self, send: Callable[[list[dict[str, Any]]], Any] | None = None) -> Any:
        """Send the summaries held (``send``: instead of the upstream); what it returned."""
        self._summary_timer = None
        batch, self._summaries = self._summaries, []
        self._summary_of = {}
        if batch:
            self.sent += 1
            try:
                return (send or self.upstream.summaries)(batch)
            except Exception as exc:  # observing must never break the loop
                logger.debug("rayguard: node %s: step summaries not sent: %s", self.node, exc)
        return None

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class NodeAgent:
    """The actor body (asyncio): a :class:`NodeAggregator` over the run's coordinator.
    ``relay``: the agent that relays this node's step summaries and gather batches
    (``None``: this one relays its group's, :mod:`rayguard.run.relay`,
    :mod:`rayguard.run.gather_relay`)."""

    def __init__(self, coordinator: Any, node: str, relay: Any = None) -> None:
        self._coordinator = coordinator
        self._node = node
        self._relay = relay
        self._aggregator: NodeAggregator | None = None
        self._lead: SummaryRelay | None = None
        self._group: GroupGather | None = None
        if relay is not None:  # the relay's gather batches wait for this node too
            relay.joined.remote(node)

    @property
    def _agg(self) -> NodeAggregator:
        if self._aggregator is None:  # made on the event loop (its timers need it)
            direct = RayUpstream(self._coordinator)
            if self._relay is None:
                self._lead = SummaryRelay(self._coordinator.step_summaries_nodes.remote,
                                          every_s=SUMMARY_EVERY_S)
                self._group = GroupGather(direct.gather_group)
                self._group.join(self._node)
                gathers = RelayedGathers(direct, self._group.gather, node=self._node)
                upstream = RelayingUpstream(direct, self._lead.add, gathers)
            else:
                sender = RelaySender(self._relay.relay_summaries.remote, direct.summaries)
                gathers = RelayedGathers(direct, self._relay.relay_gather.remote,
                                         node=self._node, ping=self._relay.ping.remote)
                upstream = RelayingUpstream(direct, sender.send, gathers)
            self._aggregator = NodeAggregator(upstream, self._node)
        return self._aggregator

    async def relay_summaries(self, batch: list[dict[str, Any]]) -> None:
        """Another node's batch of step summaries, sent on with this group's."""
        if self._agg is not None and self._lead is not None:
            self._lead.add(batch)
        else:  # not a relay (a caller's mistake): straight on
            self._coordinator.step_summaries.remote(batch)

    async def relay_gather(self, tag: str, node: str, batch: str, world_size: int,
                           values: dict[int, Any], timeout_s: float, keep: bool,
                           full: bool) -> Any:
        """Another node's gather batch, sent on with this group's; its answer unread."""
        if self._agg is None or self._group is None:  # not a relay: the node goes straight
            raise RayGuardError(f"the agent of node {self._node} relays no group's gathers")
        return await self._group.gather(tag, node, batch, world_size, values, timeout_s, keep,
                                        full)

    async def joined(self, node: str) -> None:
        """``node``'s agent started in this relay's group."""
        if self._agg is not None and self._group is not None:
            self._group.join(node)

    async def gather(self, tag: str, rank: int, world_size: int, value: Any,
                     timeout_s: float = 1800.0, keep: bool = False, local: int = 0,
                     root: int | None = None, sink: Callable[[dict[int, Any]], Any] | None = None
                     ) -> list[Any] | None:
        return await self._agg.gather(tag, rank, world_size, value, timeout_s, keep, local,
                                      root)

    async def wait_fact(self, key: str, timeout_s: float) -> Any:
        return await self._agg.wait_fact(key, timeout_s)

    async def summary(self, summary: dict[str, Any]) -> None:
        self._agg.summary(summary)

    async def flush(self) -> None:
        """The run ends: the summaries held here go now, straight (a relay's: its group's)."""
        agg, lead = self._aggregator, self._lead
        for ref in (agg and agg.flush_summaries(self._coordinator.step_summaries.remote),
                    lead and lead.flush()):
            if ref is not None:
                await ref  # type: ignore[misc]  # an ObjectRef (`x and y` types as a union)

    async def answer_diagnosis(self, attempt: int, rank: int, answer: dict[str, Any],
                               local: int = 0) -> None:
        await self._agg.answer_diagnosis(attempt, rank, answer, local)

    async def deliver(self, kind: str, mid: str, payload: Any) -> None:
        await self._agg.deliver(kind, mid, payload)

    async def read(self, key: str) -> Any:
        return await self._agg.read(key)

    async def claim(self, key: str) -> bool:
        return await self._agg.claim(key)

    async def memory_lookup(self, path: str, rank: int) -> Any:
        return await self._agg.memory_lookup(path, rank)

    async def memory_copy_to_peer(self, path: str, rank: int, world_size: int, wait_s: float,
                                  timeout_s: float) -> str | None:
        return await self._agg.memory_copy_to_peer(path, rank, world_size, wait_s, timeout_s)

    async def sent(self) -> int:
        return self._agg.calls

    def ping(self) -> bool:
        return True


def agent_name(coordinator_id: str, node: str) -> str:
    """The registry name of ``node``'s agent for the run whose coordinator is
    ``coordinator_id`` (unique per run: two runs on one cluster never share one)."""
    return f"rayguard-agent:{coordinator_id}:{node}"


def start_agent(coordinator: Any, coordinator_id: str, node: str, *, pin: bool = True,
                relay: Any = None) -> Any:
    """``node``'s agent (called in the coordinator, which thereby owns it); ``pin``: on that
    node (a real node id), else anywhere (a benchmark's simulated node); ``relay``: the
    agent that relays its step summaries and gathers (``None``: it relays its group's)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": MAX_WAITERS,
                               "name": agent_name(coordinator_id, node)}
    if pin:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return ray.remote(NodeAgent).options(**options).remote(coordinator, node, relay)


def wants_agents(world_size: int, setting: str | None) -> bool:
    """Whether ranks of a ``world_size`` run talk through node agents (``setting``: the
    ``RAYGUARD_NODE_AGENTS`` value, ``"1"`` always, ``"0"`` never)."""
    if setting in ("0", "1"):
        return setting == "1"
    if setting:
        logger.warning("rayguard: RAYGUARD_NODE_AGENTS=%r is neither 0 nor 1: ignored (node "
                       "agents from %s ranks on)", setting, AGENT_MIN_WORLD)
    return world_size >= AGENT_MIN_WORLD


def find_agent(coordinator: Any, node: str, timeout_s: float | None = None) -> Any:
    """This node's agent: found in Ray's registry (no call to the coordinator), or started
    by the coordinator for the node's first rank."""
    import ray

    from rayguard._ray.core import actor_id

    coordinator_id = actor_id(coordinator)
    try:
        return ray.get_actor(agent_name(coordinator_id, node))
    except ValueError:  # not there yet: the coordinator starts it (once per node)
        return ray.get(coordinator.node_agent.remote(node), timeout=timeout_s)


__all__ = ["AGENT_MIN_WORLD", "NodeAgent", "NodeAggregator", "RayUpstream", "Upstream",
           "agent_name", "find_agent", "start_agent", "wants_agents"]
