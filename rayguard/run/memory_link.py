"""A worker's calls to the coordinator's memory tier (:mod:`rayguard.run.memory_host`).

Mixins of :class:`~rayguard.run.link.RunLink` (:class:`MemoryCalls`) and of its
coordinator-less :class:`~rayguard.run.link.NullLink` (:class:`NullMemoryCalls`: no tier),
kept apart so that the link's module stays small. Every call is bounded by the link's
``timeouts.memory_s``.

Every rank offers its copy at each in-memory checkpoint: with a node agent (a large run,
:mod:`rayguard.run.agent`) the offer is an :data:`~rayguard.run.outbox.OFFER` message,
sent with the node's others in one ``deliver`` call and waited for as a waited event is
(the rank's call returns once the coordinator has it; one the agent did not take goes
straight, and the coordinator registers each offer once by its id). Its object references
are passed on, not resolved: Ray passes references nested in arguments by reference, so
the agent borrows them on their way and the coordinator's ``memory_offer`` gets the same
references (owned by the node's keeper) as a straight call. What stays straight: rank 0's
commit (one call a checkpoint), whether a copy is committed (rank 0), the look-ups of a
restore (once per restart, not per checkpoint, and the coordinator's answer per rank asks
which nodes are alive and pings the keepers: a per-node path needs a batched look-up), and
the peer copies (each held open for seconds while the coordinator copies).
"""

from __future__ import annotations

from typing import Any

from rayguard.exceptions import RayGuardError
from rayguard.run.outbox import OFFER, message_id

Copies = list[tuple[str, str, list[Any]]]
"""``[(which, node, [ref])]``: a snapshot's live copies, own first (``which``: own, peer)."""


class MemoryCalls:
    """The memory tier's registry calls of a worker's link."""

    ctx: Any
    actor: Any
    timeouts: Any
    _delivery: Any  # rayguard/run/message_link.py: through the node's agent, or None

    def memory_keeper(self, node_id: str) -> Any:
        import ray

        return ray.get(self.actor.memory_keeper.remote(node_id), timeout=self.timeouts.memory_s)

    def memory_offer(self, final: str, step: int, digests: dict[str, str],
                     refs: list[Any]) -> None:
        """Register this rank's memory copy of ``final`` (``refs``: the keeper's references,
        passed on unresolved); returns once the coordinator has it."""
        import ray

        ctx, timeout_s = self.ctx, self.timeouts.memory_s
        args = (final, step, ctx.rank, ctx.node_id, digests, refs)
        if self._delivery is not None:  # with the node's other offers (borrowed on the way)
            self._delivery.send((OFFER, message_id(), args), wait=True, timeout_s=timeout_s)
            return
        ray.get(self.actor.memory_offer.remote(*args), timeout=timeout_s)

    def memory_copy_to_peer(self, final: str) -> str | None:
        """Have the coordinator copy this rank's snapshot of ``final`` to its peer node; the
        node that holds the copy now, or None (no peer)."""
        import ray

        ctx, timeout_s = self.ctx, self.timeouts.memory_s
        return ray.get(self.actor.memory_copy_to_peer.remote(
            final, ctx.rank, ctx.world_size, timeout_s / 4, timeout_s), timeout=2 * timeout_s)

    def memory_commit(self, final: str, step: int) -> None:
        self.actor.memory_commit.remote(final, step)

    def memory_committed(self) -> str | None:
        import ray

        return ray.get(self.actor.memory_committed.remote(), timeout=self.timeouts.memory_s)

    def memory_lookup(self, path: str, rank: int) -> tuple[Copies, dict[str, str]] | None:
        import ray

        return ray.get(self.actor.memory_lookup.remote(path, rank),
                       timeout=self.timeouts.memory_s)


class NullMemoryCalls:
    """No coordinator: no memory tier (offers are dropped, nothing is ever held)."""

    def memory_keeper(self, node_id: str) -> Any:
        raise RayGuardError("no coordinator: no memory tier")

    def memory_offer(self, final: str, step: int, digests: dict[str, str],
                     refs: list[Any]) -> None:
        return None

    def memory_copy_to_peer(self, final: str) -> str | None:
        return None

    def memory_commit(self, final: str, step: int) -> None:
        return None

    def memory_committed(self) -> str | None:
        return None

    def memory_lookup(self, path: str, rank: int) -> tuple[Copies, dict[str, str]] | None:
        return None
