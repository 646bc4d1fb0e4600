"""A worker's calls to the coordinator's memory tier (:mod:`rayguard.run.memory_host`).

Mixins of :class:`~rayguard.run.link.RunLink` (:class:`MemoryCalls`) and of its
coordinator-less :class:`~rayguard.run.link.NullLink` (:class:`NullMemoryCalls`: no tier),
kept apart so that the link's module stays small. Every call is bounded by the link's
``timeouts.memory_s`` (a look-up or peer copy the agent did not answer: twice, once at the
agent and once straight).

Every rank offers its copy at each in-memory checkpoint: with a node agent (a large run,
:mod:`rayguard.run.agent`) the offer is an :data:`~rayguard.run.outbox.OFFER` message,
sent with the node's others in one ``deliver`` call and waited for as a waited event is
(the rank's call returns once the coordinator has it; one the agent did not take goes
straight, and the coordinator registers each offer once by its id). Its object references
are passed on, not resolved: Ray passes references nested in arguments by reference, so
the agent borrows them on their way and the coordinator's ``memory_offer`` gets the same
references (owned by the node's keeper) as a straight call.

A restore's look-ups (every rank asks for its shard's copies, and most for rank 0's too)
and the peer copies (every rank, at each in-memory checkpoint with peer copies on) go
through the agent as well: the agent asks those of one checkpoint that its ranks ask within
:data:`~rayguard.run.node_asks.MEMORY_FLUSH_S` in one call (``memory_lookup_many``,
``memory_copy_to_peer_many``, :mod:`rayguard.run.node_asks`) and hands each rank its own
answer. One the agent does not answer (its call raised: the agent died; or no answer within
the call's timeout) is asked of the coordinator, straight, as without an agent; a peer copy
asked twice so is copied twice, the second replacing the first. What stays straight: rank
0's commit (one call a checkpoint), whether a copy is committed (rank 0), and each worker
process's keeper handle (once per process).
"""

from __future__ import annotations

import logging
from typing import Any

from rayguard.exceptions import RayGuardError
from rayguard.run.outbox import OFFER, message_id

logger = logging.getLogger("rayguard")

Copies = list[tuple[str, str, list[Any]]]
"""``[(which, node, [ref])]``: a snapshot's live copies, own first (``which``: own, peer)."""


class MemoryCalls:
    """The memory tier's registry calls of a worker's link."""

    ctx: Any
    actor: Any
    agent: Any
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
        ctx, timeout_s = self.ctx, self.timeouts.memory_s
        return self._memory_ask("memory_copy_to_peer", (final, ctx.rank, ctx.world_size,
                                                        timeout_s / 4, timeout_s), 2 * timeout_s)

    def memory_commit(self, final: str, step: int) -> None:
        self.actor.memory_commit.remote(final, step)

    def memory_committed(self) -> str | None:
        import ray

        return ray.get(self.actor.memory_committed.remote(), timeout=self.timeouts.memory_s)

    def memory_lookup(self, path: str, rank: int) -> tuple[Copies, dict[str, str]] | None:
        """Rank ``rank``'s copies of ``path`` and their digests (None: not servable)."""
        return self._memory_ask("memory_lookup", (path, rank), self.timeouts.memory_s)

    def _memory_ask(self, method: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """``method(*args)`` asked through the node's agent (with its other ranks'), else, or
        when the agent does not answer within ``timeout_s``, of the coordinator."""
        import ray

        if self.agent is not None:
            try:
                return ray.get(getattr(self.agent, method).remote(*args), timeout=timeout_s)
            except Exception as exc:  # the agent is gone or stuck: ask the coordinator
                logger.info("rayguard: the node agent did not answer %s of rank %s (%s); "
                            "asking the coordinator", method, args[1], type(exc).__name__)
        return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)


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
