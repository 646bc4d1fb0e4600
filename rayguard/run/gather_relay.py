"""Gather contributions relayed: a second level of aggregation above the nodes for gathers.

A node's agent (:mod:`rayguard.run.agent`) sends its ranks' contributions to a gather (the
set-up facts, a commit's records, a report's flags) in one call; at 2,048 nodes that is
still 2,048 calls per gather at the coordinator, each costing it Ray's per-call work (about
1-2 s of its CPU per gather). The agents are grouped as for step summaries
(:func:`rayguard.run.relay.relay_of`: 32 in start order, the first relays): a node gives its
batch to its group's relay, which sends every node batch it holds of that gather in one call
(:class:`GroupGather`; ``gather_group`` at the coordinator) and hands each node its answer
(the whole answer, or the errors only: :class:`~rayguard.run.waits.GroupAnswer`).

Unlike a summary, a gather's answer is waited for, so a relay may not stand between a node
and its answer when it is lost. A node's side (:class:`RelayedGathers`) sends each batch
with an id and, when its relay is lost (the call raises: the actor died; or the relay no
longer answers a ping while the node waits: :data:`PROBE_S`), sends the same batch straight
to the coordinator, as every node did before, and goes straight from then on. A batch may
then arrive twice (in the relay's call and on its own), in either order: the coordinator
joins each batch id once (:class:`~rayguard.run.waits.GatherBoard`), so every contribution
counts once. The relay sends what it holds when every node of its group has brought its
batch, or :data:`RELAY_FLUSH_S` after the first, so that what it holds always waits at the
coordinator, where a released attempt ends every wait: a member that never comes (its agent
died) delays the group by that much, never holds it. A relay whose own agent dies makes its
own node's ranks' calls raise, as any agent's death does: their attempt fails into the
normal recovery, never a silent wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rayguard.run.waits import GroupAnswer

logger = logging.getLogger("rayguard")

RELAY_FLUSH_S = 0.05
"""How long a relay's batch of a gather waits for the rest of its group after its first
node batch (sent at once when every node of the group is in): the most a missing member
(a dead agent, a late node) adds to the group's arrival at the coordinator."""
PROBE_S = 10.0
"""While a node waits for its relay's answer, how often it pings the relay, and how long the
ping may take: a relay that does not answer is lost (its node gone before Ray says so, or
its event loop stuck), and the node sends its batch straight to the coordinator."""
SEEN_KEEP = 64
"""Gathers whose arrived nodes a relay remembers (the gathers of now)."""

SendGroup = Callable[[str, int, dict[str, dict[int, Any]], float, bool, bool, bool],
                     Awaitable[GroupAnswer | None]]
"""The coordinator's ``gather_group(tag, world_size, batches, timeout_s, keep, full,
errors)``."""


def group_due(seen: set[str], members: set[str]) -> bool:
    """Whether a relay sends its group's batch of a gather now: every node of its group
    (``members``) has brought its batch (``seen``); else it waits :data:`RELAY_FLUSH_S`."""
    return members <= seen


@dataclass
class _GroupBatch:
    world_size: int
    timeout_s: float
    keep: bool
    result: asyncio.Future[GroupAnswer | None]
    batches: dict[str, dict[int, Any]] = field(default_factory=dict)
    full: bool = False
    """Whether a node of the batch needs every value."""
    errors: bool = False
    """Whether a node of the batch needs the errors only."""
    timer: asyncio.TimerHandle | None = None


class GroupGather:
    """At a group's relay: its nodes' batches of each gather, sent on in one call (``send``:
    the coordinator's ``gather_group``); call from one event loop."""

    def __init__(self, send: SendGroup, *, flush_s: float = RELAY_FLUSH_S) -> None:
        self._send = send
        self.flush_s = flush_s
        self.members: set[str] = set()
        """The group's nodes (each says so when its agent starts; one that arrives
        unannounced counts from then on)."""
        self._open: dict[str, _GroupBatch] = {}
        self._seen: OrderedDict[str, set[str]] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sent = 0
        """Calls made to the coordinator."""

    def join(self, node: str) -> None:
        """``node`` is of this group: a gather's batch waits for it (up to ``flush_s``)."""
        self.members.add(node)

    async def gather(self, tag: str, node: str, batch: str, world_size: int,
                     values: dict[int, Any], timeout_s: float, keep: bool, full: bool) -> Any:
        """Node ``node``'s batch ``batch`` of the gather ``tag``; returns its answer as the
        coordinator's ``gather_many`` would (``full``: the whole, else the errors only;
        ``None``: released or timed out). Raises what the call to the coordinator raised."""
        loop = asyncio.get_running_loop()
        group = self._open.get(tag)
        if group is None:
            group = self._open[tag] = _GroupBatch(int(world_size), timeout_s, keep,
                                                  loop.create_future())
            group.result.add_done_callback(_retrieve)
            group.timer = loop.call_later(self.flush_s, self._flush, tag)
        group.batches[batch] = dict(values)
        group.full, group.errors = group.full or full, group.errors or not full
        group.timeout_s = max(group.timeout_s, timeout_s)
        self.members.add(node)
        if group_due(self._arrived(tag, node), self.members):
            self._flush(tag)
        answer = await asyncio.shield(group.result)
        return None if answer is None else answer.for_node(full)

    def _arrived(self, tag: str, node: str) -> set[str]:
        seen = self._seen.get(tag)
        if seen is None:
            seen = self._seen[tag] = set()
            while len(self._seen) > SEEN_KEEP:
                self._seen.popitem(last=False)
        seen.add(node)
        return seen

    def _flush(self, tag: str) -> None:
        group = self._open.pop(tag, None)
        if group is None:
            return
        if group.timer is not None:
            group.timer.cancel()
        task = asyncio.ensure_future(self._forward(tag, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, tag: str, group: _GroupBatch) -> None:
        self.sent += 1
        try:
            answer = await self._send(tag, group.world_size, group.batches, group.timeout_s,
                                      group.keep, group.full, group.errors)
        except Exception as exc:  # each node of the batch sends its own straight
            if not group.result.done():
                group.result.set_exception(exc)
            return
        if not group.result.done():
            group.result.set_result(answer)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a shared future's exception as seen (its waiters may all have gone)."""
    if not fut.cancelled():
        fut.exception()


class Direct(Protocol):
    """The straight way to the coordinator, as a node's side of a relay needs it."""

    def gather_many(self, tag: str, world_size: int, values: dict[int, Any],
                    timeout_s: float, keep: bool, root: int | None,
                    batch: str | None = None, by_ref: bool = True
                    ) -> Awaitable[list[Any] | None]: ...

    def resolve(self, answer: Any, again: Callable[[], Awaitable[Any]] | None = None
                ) -> Awaitable[list[Any] | None]: ...


class RelayedGathers:
    """A node's gather batches through its group's relay (``relay``: a call of the relay's
    ``GroupGather.gather``), else straight to the coordinator (``direct``), with the same
    batch id: from the first call to the relay that failed (raised, or ``ping`` did not
    answer within ``probe_s`` while the node waited), and for good. ``ping``: ``None`` for
    the relay's own node (the relay is in its process: what fails there is the
    coordinator's call, so each such batch goes straight, and the relay is kept)."""

    def __init__(self, direct: Direct, relay: Callable[..., Awaitable[Any]] | None, *,
                 node: str, ping: Callable[[], Awaitable[Any]] | None = None,
                 probe_s: float = PROBE_S) -> None:
        self.direct = direct
        self.relay = relay
        self.node = node
        self.ping = ping
        self.probe_s = probe_s
        self._count = 0
        self.relayed = 0
        """Batches answered through the relay."""

    async def gather_many(self, tag: str, world_size: int, values: dict[int, Any],
                          timeout_s: float, keep: bool, root: int | None) -> list[Any] | None:
        """The coordinator's answer to this node's batch (what ``direct.gather_many`` gives)."""
        self._count += 1
        batch = f"{self.node}#{self._count}"
        relay = self.relay
        if relay is not None:
            full = root is None or root in values
            try:
                answer = await self._through(relay, tag, batch, world_size, values, timeout_s,
                                             keep, full)
            except Exception as exc:
                self._lost(exc)
            else:
                self.relayed += 1
                return await self.direct.resolve(answer, lambda: self.direct.gather_many(
                    tag, world_size, values, timeout_s, keep, root, batch, by_ref=False))
        return await self.direct.gather_many(tag, world_size, values, timeout_s, keep, root,
                                             batch)

    async def _through(self, relay: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        call = asyncio.ensure_future(_awaited(relay(args[0], self.node, *args[1:])))
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.probe_s)
                if done:
                    return call.result()
                if self.ping is not None:  # raises when the relay does not answer
                    await asyncio.wait_for(_awaited(self.ping()), self.probe_s)
        finally:
            if not call.done():
                call.cancel()

    def _lost(self, exc: BaseException) -> None:
        if self.ping is None:
            logger.debug("rayguard: node %s: its group's gather call failed (%s); this batch "
                         "goes straight to the coordinator", self.node, exc)
            return
        if self.relay is not None:
            logger.info("rayguard: node %s: the gather relay is gone (%s); this node's gather "
                        "batches go straight to the coordinator from now on", self.node,
                        type(exc).__name__)
        self.relay = None


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


__all__ = ["PROBE_S", "RELAY_FLUSH_S", "GroupGather", "RelayedGathers", "group_due"]
