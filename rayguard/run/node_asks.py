"""Questions every rank of a node asks at once, asked once per node by its agent.

* a **fact as it is now** (:class:`NodeReads`): every rank reads the rank assignment at
  set-up, the last commit at a live set-up, the notice of its attempt when it takes its
  place in a resized group or rejoins; the keys asked within ``flush_s`` go in one call
  (``get_many``), sent after the last of them was asked, so each answer is at least as new
  as its question (a read never joins one already sent);
* a **claim** (:class:`NodeClaims`): every rank claims the choice of the checkpoint that
  ``ray.train.get_checkpoint()`` offers; the node claims once, and the coordinator's
  ``True`` goes to the node's first rank that asked, ``False`` to every other (at most one
  rank of the run wins, as before). A node whose claim call fails raises to each of its
  ranks (each then asks the coordinator itself: if the node's claim had won there, no rank
  wins and the ranks waiting for the winner's choice time out into the normal recovery);
* the **memory tier's** look-ups at a restore and peer copies at an in-memory checkpoint
  (:class:`NodeAsks`, the general form of :class:`NodeReads`): the ranks asked of one
  checkpoint within ``MEMORY_FLUSH_S`` go in one call (``memory_lookup_many``,
  ``memory_copy_to_peer_many``), each rank getting its own answer
  (:mod:`rayguard.run.memory_link`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

READ_FLUSH_S = 0.005
"""How long a node's batch of reads waits for more local ranks after its first."""
MEMORY_FLUSH_S = 0.02
"""How long a node's batch of memory-tier look-ups or peer copies waits for more local
ranks after its first: longer than a read's, as the ranks of a restore ask after reading
the manifest (in their own processes, not in step), and each batch costs the coordinator a
question of Ray's node table and a ping of keepers (a look-up) or a wait for every rank's
offer (a peer copy), against which 20 ms is nothing."""
CLAIMS_KEEP = 4096
"""Claims a node remembers (one forgotten is asked again: the coordinator says ``False``)."""


class NodeAsks:
    """Questions of one kind that a node's ranks ask at once, asked in batches: the items
    asked of one group within ``flush_s`` of its first go in one call (``ask_many(group,
    items)``: the coordinator's answers, in the items' order), sent after the last of them
    was asked (an item asked twice in one batch is asked once, both askers get its answer);
    call from one event loop."""

    def __init__(self, ask_many: Callable[[Any, list[Any]], Awaitable[list[Any]]], *,
                 flush_s: float = READ_FLUSH_S) -> None:
        self._ask_many = ask_many
        self.flush_s = flush_s
        self._waiting: dict[Hashable, dict[Hashable, asyncio.Future[Any]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sent = 0
        """Calls made to the coordinator."""

    async def ask(self, group: Hashable, item: Hashable) -> Any:
        """The answer to ``item`` of ``group``; raises what the call to the coordinator
        raised."""
        loop = asyncio.get_running_loop()
        batch = self._waiting.get(group)
        if batch is None:
            batch = self._waiting[group] = {}
            loop.call_later(self.flush_s, self._flush, group)
        fut = batch.get(item)
        if fut is None:
            fut = batch[item] = loop.create_future()
        return await asyncio.shield(fut)

    def _flush(self, group: Hashable) -> None:
        batch = self._waiting.pop(group, None)
        if batch:
            task = asyncio.ensure_future(self._forward(group, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _forward(self, group: Hashable, batch: dict[Hashable, asyncio.Future[Any]]
                       ) -> None:
        self.sent += 1
        try:
            values = list(await self._ask_many(group, list(batch)))
        except Exception as exc:
            for fut in batch.values():
                if not fut.done():
                    fut.set_exception(exc)
                    fut.add_done_callback(_retrieve)
            return
        for fut, value in zip(batch.values(), values, strict=True):
            if not fut.done():
                fut.set_result(value)


class NodeReads(NodeAsks):
    """A node's reads of facts as they are now (``read_many``: the coordinator's
    ``get_many``), batched; call from one event loop."""

    def __init__(self, read_many: Callable[[list[str]], Awaitable[list[Any]]], *,
                 flush_s: float = READ_FLUSH_S) -> None:
        super().__init__(lambda _group, keys: read_many(keys), flush_s=flush_s)

    async def read(self, key: str) -> Any:
        """The fact ``key`` as it is now (``None``: not there); raises what the call to the
        coordinator raised."""
        return await self.ask(None, key)


class NodeClaims:
    """A node's claims (``claim``: the coordinator's), each asked once; call from one event
    loop."""

    def __init__(self, claim: Callable[[str], Awaitable[bool]], *,
                 keep: int = CLAIMS_KEEP) -> None:
        self._claim = claim
        self.keep = keep
        self._asked: OrderedDict[str, asyncio.Future[bool]] = OrderedDict()
        self.sent = 0
        """Calls made to the coordinator."""

    async def claim(self, key: str) -> bool:
        """Whether the asking rank is the first of the run to claim ``key``."""
        asked = self._asked.get(key)
        if asked is not None:  # a rank of this node asked first: it has the answer
            await asyncio.shield(asked)  # raises what the node's claim raised
            return False
        asked = self._asked[key] = asyncio.ensure_future(self._ask(key))
        asked.add_done_callback(_retrieve)
        while len(self._asked) > self.keep:
            self._asked.popitem(last=False)
        return bool(await asyncio.shield(asked))

    async def _ask(self, key: str) -> bool:
        self.sent += 1
        return bool(await self._claim(key))


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a shared future's exception as seen (its waiters may all have gone)."""
    if not fut.cancelled():
        fut.exception()


__all__ = ["CLAIMS_KEEP", "MEMORY_FLUSH_S", "READ_FLUSH_S", "NodeAsks", "NodeClaims", "NodeReads"]
