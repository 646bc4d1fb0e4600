"""The coordinator's half of the memory tier: the keepers it owns and the snapshot registry.

A mixin of :class:`~rayguard.run.coordinator.RunCoordinator` (the actor), kept apart so that
the memory tier reads in one place: each node's keeper (:mod:`rayguard.run.keeper`), which
copies exist (:class:`~rayguard.checkpoint.memory.SnapshotRegistry`), where each rank's
second copy goes (:func:`~rayguard.checkpoint.peer.peer_node`), and which copies a restart
may still fetch (those on alive nodes, own copy first). The workers' half is
:mod:`rayguard.train.memory_tier`. A node's agent asks its ranks' look-ups and peer copies
in one call each (``memory_lookup_many``, ``memory_copy_to_peer_many``,
:mod:`rayguard.run.memory_link`); a rank without one asks its own. Either way a call asks
Ray's node table at most once a second for all of them (:data:`ALIVE_FRESH_S`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rayguard.checkpoint.memory import Snapshot, SnapshotRegistry
from rayguard.checkpoint.peer import peer_node

logger = logging.getLogger("rayguard")

Lookup = tuple[list[tuple[str, str, list[Any]]], dict[str, str]]
"""A look-up's answer: ``(copies, digests)``, copies ``[(which, node, [ref])]``, own first."""

KEEPER_PING_S = 5.0
"""How long a lookup waits for a keeper's ping before it leaves that keeper's copy out (a
node whose loss Ray has not yet noticed): short, so a lost node costs seconds, not the
memory tier's whole timeout."""
ALIVE_FRESH_S = 1.0
"""How long one answer of Ray's node table (:func:`_alive_nodes`) serves the memory tier's
calls: the look-ups of every rank of a restore, or of every node, come within a second, and
ask it once, not once each. Safe: a node lost inside the window is still listed as alive,
as it is anyway until Ray notices the loss (which takes longer than this window); where a
rank has another copy, the keeper ping that already runs for such a node
(:data:`KEEPER_PING_S`) leaves the lost node's copy out, a rank's only copy on it fails its
fetch and the rank reads the disk, and a peer chosen on it fails its copy (no peer)."""


class MemoryHost:
    """The memory-tier methods of the coordinator actor (call :meth:`_init_memory` first;
    every method runs on the actor's event loop)."""

    def _init_memory(self) -> None:
        self._memory = SnapshotRegistry()
        self._keepers: dict[str, Any] = {}
        self._offered: list[asyncio.Future[None]] = []  # woken by the next offer
        self._alive_query: tuple[asyncio.Future[set[str] | None], float] | None = None

    def memory_keeper(self, node_id: str) -> Any:
        """The keeper actor of ``node_id`` (started on first use; owned by this actor, so it
        and the copies it holds outlive every worker-group restart, not this run)."""
        from rayguard.run.keeper import start_keeper

        if node_id not in self._keepers:
            self._keepers[node_id] = start_keeper(node_id)
        return self._keepers[node_id]

    def memory_offer(self, path: str, step: int, rank: int, node: str, digests: dict[str, str],
                     refs: list[Any]) -> None:
        """A rank's memory copy of checkpoint ``path`` (servable once ``path`` commits)."""
        self._memory.offer(Snapshot(path, step, rank, node, dict(digests), refs))
        offered, self._offered = self._offered, []
        for fut in offered:
            if not fut.done():
                fut.set_result(None)

    async def memory_copy_to_peer(self, path: str, rank: int, world_size: int,
                            wait_s: float = 30.0, timeout_s: float = 120.0) -> str | None:
        """Have the keeper of rank ``rank``'s peer node take a second copy of its snapshot of
        ``path``; returns that node, or None (one node, the own copy is not held, or the
        copy failed). Waits up to ``wait_s`` for every rank's own copy, so that the peer is
        chosen among the nodes of all the run's workers. Run here, not in the worker: this
        actor holds the references from end to end, so a worker killed meanwhile cannot take
        a copy's last borrower with it."""
        await self._offers_of(path, world_size, wait_s)
        return await self._copy_to_peer(path, rank, await self._alive(), timeout_s)

    async def memory_copy_to_peer_many(self, path: str, ranks: list[int], world_size: int,
                                       wait_s: float = 30.0, timeout_s: float = 120.0
                                       ) -> list[str | None]:
        """:meth:`memory_copy_to_peer` for each of ``ranks`` (a node's, asked together by its
        agent): one wait for the offers, the copies at once; each rank's peer node, or None
        (a copy that failed is logged here). The references stay in this actor as they do
        for one rank."""
        await self._offers_of(path, world_size, wait_s)
        alive = await self._alive()
        done = await asyncio.gather(*(self._copy_to_peer(path, r, alive, timeout_s)
                                      for r in ranks), return_exceptions=True)
        out: list[str | None] = []
        for rank, peer in zip(ranks, done, strict=True):
            if isinstance(peer, BaseException):
                logger.warning("rayguard: no peer memory copy of rank %d's snapshot of %s "
                               "(%s: %s)", rank, path, type(peer).__name__, peer)
                peer = None
            out.append(peer)
        return out

    async def _offers_of(self, path: str, world_size: int, wait_s: float) -> None:
        """Wait up to ``wait_s`` for every rank's own copy of ``path``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + wait_s
        while len(self._memory.nodes_of(path)) < world_size and loop.time() < end:
            fut = loop.create_future()
            self._offered.append(fut)
            try:
                await asyncio.wait_for(fut, end - loop.time())
            except asyncio.TimeoutError:
                break

    async def _copy_to_peer(self, path: str, rank: int, alive: set[str] | None,
                            timeout_s: float) -> str | None:
        snap = self._memory.snapshot(path, rank)
        if snap is None:
            return None
        peer = peer_node(snap.node, self._memory.nodes_of(path).values(), alive)
        if peer is None:
            return None
        # the peer keeper receives the bytes from the own node's object store and puts them
        # into its own, owned by itself: the copy outlives the own node
        refs = await asyncio.wait_for(_awaitable(self.memory_keeper(peer).hold.remote(snap.refs[0])),
                                      timeout_s)
        return peer if self._memory.offer_peer(path, rank, peer, refs) else None

    async def _alive(self) -> set[str] | None:
        """The nodes alive now, as of at most :data:`ALIVE_FRESH_S` ago: one question of
        Ray's node table (in an executor) serves every call in that window, and the calls
        that come while it is asked wait for its answer."""
        held = self._alive_query
        if held is None or (held[0].done() and _now() - held[1] >= ALIVE_FRESH_S):
            held = self._alive_query = (
                asyncio.get_running_loop().run_in_executor(None, _alive_nodes), _now())
        return await asyncio.shield(held[0])

    def memory_commit(self, path: str, step: int) -> None:
        """Rank 0 committed ``path``: its copies become servable, older ones are freed."""
        self._memory.commit(path, step)

    def memory_committed(self) -> str | None:
        return self._memory.committed

    async def memory_lookup(self, path: str, rank: int) -> Lookup | None:
        """(copies, digests) of rank ``rank``'s snapshot of ``path`` if servable, else None;
        copies: ``[(which, node, [ref])]``, ``which`` being "own" or "peer", own first, the
        copies on nodes no longer alive left out (their keeper died with the node)."""
        return (await self.memory_lookup_many(path, [rank]))[0]

    async def memory_lookup_many(self, path: str, ranks: list[int]) -> list[Lookup | None]:
        """:meth:`memory_lookup` of each of ``ranks`` (a node's, asked together by its agent),
        in order: one question of the nodes alive and one ping round of the keepers whose
        node holds a copy of a rank that has two, whatever the number of ranks."""
        alive = await self._alive()
        found: dict[int, Lookup] = {}
        for rank in dict.fromkeys(ranks):
            snap = self._memory.lookup(path, rank)
            if snap is not None:
                found[rank] = (self._memory.copies(path, rank, alive), dict(snap.digests))
        doubtful = {node for copies, _ in found.values() if len(copies) > 1
                    for _, node, _ in copies}  # a node not yet known dead: no keeper answers
        if doubtful:
            answering = await _answering({node: self._keepers.get(node) for node in doubtful},
                                         KEEPER_PING_S)
            found = {rank: ([c for c in copies if c[1] in answering] or copies, digests)
                     if len(copies) > 1 else (copies, digests)
                     for rank, (copies, digests) in found.items()}
        return [found.get(rank) for rank in ranks]


async def _awaitable(ref: Any) -> Any:
    """An object reference awaited on the actor's event loop."""
    return await ref


async def _answering(keepers: dict[str, Any], timeout_s: float) -> set[str]:
    """The nodes whose keeper answers a ping within ``timeout_s`` (all pings in parallel)."""
    pings = {asyncio.ensure_future(_awaitable(k.ping.remote())): node
             for node, k in keepers.items() if k is not None}
    if not pings:
        return set()
    done, pending = await asyncio.wait(list(pings), timeout=timeout_s)
    for task in pending:
        task.cancel()
    out = set()
    for task in done:
        if task.exception() is None and task.result():  # else: the keeper died
            out.add(pings[task])
    return out


def _now() -> float:
    """The clock of :data:`ALIVE_FRESH_S` (a test's to replace)."""
    return time.monotonic()


def _alive_nodes() -> set[str] | None:
    """The nodes alive now (``None``: not known, outside Ray or Ray did not answer)."""
    from rayguard._ray.core import alive_node_resources

    try:
        return set(alive_node_resources())
    except Exception:
        return None
