"""Step summaries relayed: a second level of aggregation above the nodes.

A node's agent (:mod:`rayguard.run.agent`) sends its ranks' step summaries in one call every
``SUMMARY_EVERY_S``; at 2,048 nodes that is still 400 calls a second to the coordinator, each
costing it Ray's per-call work. Summaries may be late and may be lost (observing never
breaks a run), so they climb one level more: the agents are taken in groups
of :data:`RELAY_NODES` in the order the coordinator started them, the first of each group
relays (:class:`SummaryRelay`) and sends its group's node batches in one call
(``step_summaries_nodes``); the coordinator still reads one batch per node (one ``steps``
event per node, as before). A lost relay can only delay summaries: a node whose relay is
gone sends its own straight to the coordinator from then on (:class:`RelaySender`).
Gathers climb the same level, with a fallback of their own since their answer is waited
for (:mod:`rayguard.run.gather_relay`); facts, the diagnosis' answers and a node's messages,
reads and claims (:mod:`rayguard.run.outbox`, :mod:`rayguard.run.node_asks`) never go
through another node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("rayguard")

RELAY_NODES = 32
"""Nodes per relay group: the coordinator hears ``nodes / 32`` summary calls per
``SUMMARY_EVERY_S`` (64 every 5 s at 2,048 nodes, was 2,048)."""

Batch = list[dict[str, Any]]


def relay_of(index: int, group: int = RELAY_NODES) -> int | None:
    """The start index of the agent that relays the summaries of the agent started
    ``index``-th (``None``: it relays its group itself, being its first)."""
    lead = index - index % group
    return None if lead == index else lead


class SummaryRelay:
    """Node batches of step summaries (its own node's and its group's), sent on in one
    call (``send``) ``every_s`` after the first arrives; call from one event loop."""

    def __init__(self, send: Callable[[list[Batch]], Any], *, every_s: float) -> None:
        self._send = send
        self.every_s = every_s
        self._batches: list[Batch] = []
        self._timer: asyncio.TimerHandle | None = None
        self.sent = 0
        """Calls made upstream."""

    def add(self, batch: Batch) -> None:
        if not batch:
            return
        self._batches.append(batch)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.every_s, self.flush)

    def flush(self) -> Any:
        """Send the batches held; what the send returned (``None``: nothing sent)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        batches, self._batches = self._batches, []
        if batches:
            self.sent += 1
            try:
                return self._send(batches)
            except Exception as exc:  # observing must never break the run
                logger.debug("rayguard: relayed step summaries not sent: %s", exc)
        return None


class RelaySender:
    """A grouped node's summaries, sent to its group's relay (``relay``: an awaitable call
    of the relay agent), or with ``fallback`` (straight to the coordinator) from the first
    call to the relay that failed on (its node is gone)."""

    def __init__(self, relay: Callable[[Batch], Awaitable[Any]] | None,
                 fallback: Callable[[Batch], None]) -> None:
        self.relay = relay
        self.fallback = fallback
        self._tasks: set[asyncio.Task[Any]] = set()

    def send(self, batch: Batch) -> None:
        if self.relay is None:
            self.fallback(batch)
            return
        task = asyncio.ensure_future(self._through(self.relay, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _through(self, relay: Callable[[Batch], Awaitable[Any]], batch: Batch) -> None:
        try:
            await relay(batch)
        except Exception as exc:
            if self.relay is not None:
                logger.info("rayguard: the step-summary relay is gone (%s); this node sends "
                            "its own to the coordinator from now on", type(exc).__name__)
            self.relay = None
            self.fallback(batch)


class RelayingUpstream:
    """An upstream (``inner``) whose step summaries take another way (``summaries``), and its
    gathers too when ``gathers`` is given (:class:`~rayguard.run.gather_relay.RelayedGathers`:
    through the group's relay, falling back to ``inner``); facts, the diagnosis' answers,
    messages, reads, claims and the memory tier's go straight to ``inner``."""

    def __init__(self, inner: Any, summaries: Callable[[Batch], None],
                 gathers: Any = None) -> None:
        self.inner = inner
        self.summaries = summaries
        self.gathers = inner if gathers is None else gathers

    def gather_many(self, *args: Any) -> Any:
        return self.gathers.gather_many(*args)

    def wait_fact(self, key: str, timeout_s: float) -> Any:
        return self.inner.wait_fact(key, timeout_s)

    def answer_diagnosis_many(self, attempt: int, answers: dict[int, dict[str, Any]]) -> Any:
        return self.inner.answer_diagnosis_many(attempt, answers)

    def deliver(self, messages: list[Any]) -> Any:
        return self.inner.deliver(messages)

    def get_many(self, keys: list[str]) -> Any:
        return self.inner.get_many(keys)

    def claim(self, key: str) -> Any:
        return self.inner.claim(key)

    def memory_lookup_many(self, *args: Any) -> Any:
        return self.inner.memory_lookup_many(*args)

    def memory_copy_to_peer_many(self, *args: Any) -> Any:
        return self.inner.memory_copy_to_peer_many(*args)


__all__ = ["RELAY_NODES", "RelaySender", "RelayingUpstream", "SummaryRelay", "relay_of"]
