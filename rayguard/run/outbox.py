"""A node's one-way messages to the coordinator: events, facts a rank leaves, failure records,
memory-tier offers.

What every rank of a large run says at once (a ``rejoined`` event at a live recovery or a
resize, ``nan_detected`` when a NaN reaches every rank, ``stall_detected`` and the kill
marks when a collective hangs everywhere, a kept rank's ``resize:left`` mark, every rank's
hang-diagnosis place at set-up, the failure record of every rank of a failed attempt, every
rank's memory copy offered at an in-memory checkpoint) goes through its node's agent
(:mod:`rayguard.run.agent`): the agent's :class:`Outbox` sends its ranks' messages in one
call (``deliver``), ``flush_s`` after the first, with one call in flight per node (what
comes while one is in flight goes in the next), so a rank's messages reach the coordinator
in the order the agent got them. Each rank's call returns once the coordinator has its
message (raising what the call raised), whether the rank waits for it or not: a rank that
does not wait still watches the answer (:class:`rayguard.run.message_link.AgentDelivery`)
and sends the message straight to the coordinator when the agent did not take it (the
agent died, or did not answer in time).

A message may so reach the coordinator twice (through the agent, then straight): each
carries an id (:func:`message_id`), and the coordinator acts on each id once
(:class:`Delivered`).
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

OUTBOX_FLUSH_S = 0.01
"""How long a node's batch of messages waits for more of its ranks' after its first (the
ranks that say something at once say it within a few milliseconds of each other)."""
DELIVERED_KEEP = 1 << 18
"""Message ids the coordinator remembers (a duplicate comes seconds after its first)."""

EVENT = "event"
"""A message kind: an event for the run's log (payload: the event)."""
FACT = "fact"
"""A message kind: a fact left with the coordinator (payload: ``(key, value)``)."""
FAILURE = "failure"
"""A message kind: how a rank's attempt ended (payload: ``record_failure``'s arguments)."""
OFFER = "offer"
"""A message kind: a rank's memory copy of a checkpoint (payload: ``memory_offer``'s
arguments, ``(final, step, rank, node, digests, refs)``; its object references are passed
on, not resolved, :mod:`rayguard.run.memory_link`)."""
KINDS = (EVENT, FACT, FAILURE, OFFER)

Message = tuple[str, str, Any]
"""``(kind, id, payload)``."""


def message_id() -> str:
    """A new message's id (random: unique across the run's processes and nodes)."""
    return os.urandom(8).hex()


class Outbox:
    """One node's messages, sent in batches (``send``: the coordinator's ``deliver``), one
    call in flight; call from one event loop."""

    def __init__(self, send: Callable[[list[Message]], Awaitable[Any]], *,
                 flush_s: float = OUTBOX_FLUSH_S) -> None:
        self._send = send
        self.flush_s = flush_s
        self._waiting: list[Message] = []
        self._acks: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sent = 0
        """Calls made to the coordinator."""

    async def post(self, message: Message) -> None:
        """Send ``message`` with the node's others; returns once the coordinator has it."""
        loop = asyncio.get_running_loop()
        ack: asyncio.Future[None] = loop.create_future()
        self._waiting.append(message)
        self._acks.append(ack)
        if self._timer is None and not self._busy:
            self._timer = loop.call_later(self.flush_s, self._flush)
        await ack

    def _flush(self) -> None:
        self._timer = None
        if self._busy or not self._waiting:
            return
        batch, acks = self._waiting, self._acks
        self._waiting, self._acks = [], []
        self._busy = True
        task = asyncio.ensure_future(self._forward(batch, acks))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, batch: list[Message], acks: list[asyncio.Future[None]]) -> None:
        self.sent += 1
        try:
            await self._send(batch)
        except Exception as exc:  # every rank of the batch sends its own straight
            for ack in acks:
                if not ack.done():
                    ack.set_exception(exc)
        else:
            for ack in acks:
                if not ack.done():
                    ack.set_result(None)
        finally:
            self._busy = False
            if self._waiting:  # what came meanwhile has waited long enough
                self._flush()


class Delivered:
    """At the coordinator: the ids of the messages acted on (the last ``keep``)."""

    def __init__(self, keep: int = DELIVERED_KEEP) -> None:
        self.keep = keep
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first(self, mid: str | None) -> bool:
        """Whether the message ``mid`` is new (and remember it); ``None``: no id, new."""
        if mid is None:
            return True
        if mid in self._ids:
            return False
        self._ids[mid] = None
        while len(self._ids) > self.keep:
            self._ids.popitem(last=False)
        return True


__all__ = ["DELIVERED_KEEP", "EVENT", "FACT", "FAILURE", "KINDS", "OFFER", "OUTBOX_FLUSH_S",
           "Delivered", "Message", "Outbox", "message_id"]
