"""Where the memory tier keeps a rank's second copy: the peer planner (pure, no Ray).

Each rank's committed shard is held in the object store of the node that saved it (its
*own* copy) and in that of one *peer* node, so that one node's loss leaves a copy of every
shard. The peer is the next node, in sorted node-id order and wrapping around, among the
nodes of the run's workers that are alive: deterministic (every process that asks gets the
same answer), never the rank's own node, and a node holds the peer copies of one other
node's ranks only (so that memory stays bounded: about twice its own ranks' shards). A run
on one node has no peer: it keeps one copy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


def peer_node(own: str, nodes: Iterable[str], alive: Collection[str] | None = None
              ) -> str | None:
    """The node that keeps the peer copy of a shard saved on ``own``.

    ``nodes``: the nodes of the run's workers (``own`` among them or not); ``alive``: the
    nodes alive now (``None``: all of them). Returns the first node after ``own`` in sorted
    order, wrapping around, that is alive and is not ``own``; ``None`` when there is none."""
    ring = sorted({n for n in nodes if n != own and (alive is None or n in alive)})
    if not ring:
        return None
    return next((n for n in ring if n > own), ring[0])
