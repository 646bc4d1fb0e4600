"""A worker's calls to the coordinator's memory tier (:mod:`rayguard.run.memory_host`).

Mixins of :class:`~rayguard.run.link.RunLink` (:class:`MemoryCalls`) and of its
coordinator-less :class:`~rayguard.run.link.NullLink` (:class:`NullMemoryCalls`: no tier),
kept apart so that the link's module stays small. Every call is bounded by the link's
``timeouts.memory_s``.
"""

from __future__ import annotations

from typing import Any

from rayguard.exceptions import RayGuardError

Copies = list[tuple[str, str, list[Any]]]
"""``[(which, node, [ref])]``: a snapshot's live copies, own first (``which``: own, peer)."""


class MemoryCalls:
    """The memory tier's registry calls of a worker's link."""

    ctx: Any
    actor: Any
    timeouts: Any

    def memory_keeper(self, node_id: str) -> Any:
        import ray

        return ray.get(self.actor.memory_keeper.remote(node_id), timeout=self.timeouts.memory_s)

    def memory_offer(self, final: str, step: int, digests: dict[str, str],
                     refs: list[Any]) -> None:
        import ray

        ctx = self.ctx
        ray.get(self.actor.memory_offer.remote(final, step, ctx.rank, ctx.node_id, digests,
                                               refs), timeout=self.timeouts.memory_s)

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
