"""The coordinator's half of the memory tier: the keepers it owns and the snapshot registry.

A mixin of :class:`~rayguard.run.coordinator.RunCoordinator` (the actor), kept apart so that
the memory tier reads in one place: each node's keeper (:mod:`rayguard.run.keeper`), which
copies exist (:class:`~rayguard.checkpoint.memory.SnapshotRegistry`), where each rank's
second copy goes (:func:`~rayguard.checkpoint.peer.peer_node`), and which copies a restart
may still fetch (those on alive nodes, own copy first). The workers' half is
:mod:`rayguard.train.memory_tier`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayguard.checkpoint.memory import Snapshot, SnapshotRegistry
from rayguard.checkpoint.peer import peer_node

KEEPER_PING_S = 5.0
"""How long a lookup waits for a keeper's ping before it leaves that keeper's copy out (a
node whose loss Ray has not yet noticed): short, so a lost node costs seconds, not the
memory tier's whole timeout."""


class MemoryHost:
    """The memory-tier methods of the coordinator actor (call :meth:`_init_memory` first;
    every method runs on the actor's event loop)."""

    def _init_memory(self) -> None:
        self._memory = SnapshotRegistry()
        self._keepers: dict[str, Any] = {}
        self._offered: list[asyncio.Future[None]] = []  # woken by the next offer

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
        loop = asyncio.get_running_loop()
        end = loop.time() + wait_s
        while len(self._memory.nodes_of(path)) < world_size and loop.time() < end:
            fut = loop.create_future()
            self._offered.append(fut)
            try:
                await asyncio.wait_for(fut, end - loop.time())
            except asyncio.TimeoutError:
                break
        snap = self._memory._by_rank.get(rank, {}).get(path)
        nodes = self._memory.nodes_of(path)
        if snap is None:
            return None
        alive = await loop.run_in_executor(None, _alive_nodes)
        peer = peer_node(snap.node, nodes.values(), alive)
        if peer is None:
            return None
        # the peer keeper receives the bytes from the own node's object store and puts them
        # into its own, owned by itself: the copy outlives the own node
        refs = await asyncio.wait_for(_awaitable(self.memory_keeper(peer).hold.remote(snap.refs[0])),
                                      timeout_s)
        return peer if self._memory.offer_peer(path, rank, peer, refs) else None

    def memory_commit(self, path: str, step: int) -> None:
        """Rank 0 committed ``path``: its copies become servable, older ones are freed."""
        self._memory.commit(path, step)

    def memory_committed(self) -> str | None:
        return self._memory.committed

    async def memory_lookup(self, path: str, rank: int
                            ) -> tuple[list[tuple[str, str, list[Any]]], dict[str, str]] | None:
        """(copies, digests) of rank ``rank``'s snapshot of ``path`` if servable, else None;
        copies: ``[(which, node, [ref])]``, ``which`` being "own" or "peer", own first, the
        copies on nodes no longer alive left out (their keeper died with the node)."""
        alive = await asyncio.get_running_loop().run_in_executor(None, _alive_nodes)
        snap = self._memory.lookup(path, rank)
        if snap is None:
            return None
        copies = self._memory.copies(path, rank, alive)
        keepers = {node: self._keepers.get(node) for _, node, _ in copies}
        if len(copies) > 1:  # a node not yet known dead: its keeper does not answer
            answering = await _answering(keepers, KEEPER_PING_S)
            copies = [c for c in copies if c[1] in answering] or copies
        return copies, dict(snap.digests)

    def memory_held(self) -> list[tuple[str, int, str]]:
        """(path, rank, node) of every own copy held (tests, ``rayguard`` diagnostics)."""
        return [(s.path, s.rank, s.node) for s in self._memory.held()]

    def memory_peers(self) -> list[tuple[str, int, str]]:
        """(path, rank, peer node) of every second copy held."""
        return [(s.path, s.rank, s.peer) for s in self._memory.held() if s.peer is not None]


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


def _alive_nodes() -> set[str] | None:
    """The nodes alive now (``None``: not known, outside Ray or Ray did not answer)."""
    from rayguard._ray.core import alive_node_resources

    try:
        return set(alive_node_resources())
    except Exception:
        return None
