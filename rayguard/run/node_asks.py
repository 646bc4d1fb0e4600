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
  wins and the ranks waiting for the winner's choice time out into the normal recovery).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

READ_FLUSH_S = 0.005
"""How long a node's batch of reads waits for more local ranks after its first."""
CLAIMS_KEEP = 4096
"""Claims a node remembers (one forgotten is asked again: the coordinator says ``False``)."""


class NodeReads:
    """A node's reads of facts as they are now (``read_many``: the coordinator's
    ``get_many``), batched; call from one event loop."""

    def __init__(self, read_many: Callable[[list[str]], Awaitable[list[Any]]], *,
                 flush_s: float = READ_FLUSH_S) -> None:
        self._read_many = read_many
        self.flush_s = flush_s
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sent = 0
        """Calls made to the coordinator."""

    async def read(self, key: str) -> Any:
        """The fact ``key`` as it is now (``None``: not there); raises what the call to the
        coordinator raised."""
        loop = asyncio.get_running_loop()
        fut = self._waiting.get(key)
        if fut is None:
            fut = self._waiting[key] = loop.create_future()
            if self._timer is None:
                self._timer = loop.call_later(self.flush_s, self._flush)
        return await asyncio.shield(fut)

    def _flush(self) -> None:
        self._timer = None
        batch, self._waiting = self._waiting, {}
        if batch:
            task = asyncio.ensure_future(self._forward(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _forward(self, batch: dict[str, asyncio.Future[Any]]) -> None:
        self.sent += 1
        try:
            values = list(await self._read_many(list(batch)))
        except Exception as exc:
            for fut in batch.values():
                if not fut.done():
                    fut.set_exception(exc)
                    fut.add_done_callback(_retrieve)
            return
        for fut, value in zip(batch.values(), values, strict=True):
            if not fut.done():
                fut.set_result(value)


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


__all__ = ["CLAIMS_KEEP", "READ_FLUSH_S", "NodeClaims", "NodeReads"]
