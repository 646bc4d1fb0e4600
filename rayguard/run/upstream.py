"""What a node's agent asks of the run's coordinator (:class:`Upstream`), and the coordinator
actor as one (:class:`RayUpstream`): kept apart from :mod:`rayguard.run.agent` so that a
test's in-process coordinator stands in for the actor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rayguard.run.outbox import Message
from rayguard.run.waits import ErrorsOnly

logger = logging.getLogger("rayguard")

FETCH_S = 15.0
"""How long a node waits for a gather's answer from the object store before it asks the
coordinator for it by value. An answer comes in milliseconds (16,384 ranks' set-up facts,
about 3 MB, in well under a second); seen on a 4-node cluster with agents: a node agent
whose two batches of one gather got the same answer fetched it for the first and never for
the second (``ray.get`` of it in that process timed out too, with the owner alive and
holding it), so the rank behind the second waited for ever."""


async def _fetched(ref: Any) -> Any:
    return await ref


class Upstream(Protocol):
    """What an aggregator asks of the run's coordinator (``deliver``, ``get_many``,
    ``claim`` and the memory tier's: only once a rank sends a message, reads a fact, claims
    or asks the memory tier through the agent)."""

    def gather_many(self, tag: str, world_size: int, values: dict[int, Any],
                    timeout_s: float, keep: bool, root: int | None
                    ) -> Awaitable[list[Any] | None]: ...

    def wait_fact(self, key: str, timeout_s: float) -> Awaitable[Any]: ...

    def summaries(self, batch: list[dict[str, Any]]) -> None: ...

    def answer_diagnosis_many(self, attempt: int,
                              answers: dict[int, dict[str, Any]]) -> Awaitable[None]: ...

    def deliver(self, messages: list[Message]) -> Awaitable[None]: ...

    def get_many(self, keys: list[str]) -> Awaitable[list[Any]]: ...

    def claim(self, key: str) -> Awaitable[bool]: ...

    def memory_lookup_many(self, path: str, ranks: list[int]) -> Awaitable[list[Any]]: ...

    def memory_copy_to_peer_many(self, path: str, ranks: list[int], world_size: int,
                                 wait_s: float, timeout_s: float) -> Awaitable[list[Any]]: ...


class RayUpstream:
    """The coordinator actor as an :class:`Upstream`: a gather's answer comes as an object
    reference (put once by the coordinator for every node), fetched here once, or, when the
    node gets the errors only, by value (:class:`~rayguard.run.waits.ErrorsOnly`)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def gather_many(self, tag: str, world_size: int, values: dict[int, Any],
                          timeout_s: float, keep: bool, root: int | None,
                          batch: str | None = None, by_ref: bool = True) -> list[Any] | None:
        """``by_ref=False``: the answer by value (a batch asked again, with its id)."""
        def ask(by_ref: bool) -> Any:
            return self.actor.gather_many.remote(tag, world_size, values, timeout_s, keep,
                                                 by_ref, root, batch)

        if not by_ref:
            return await ask(False)
        # a batch with an id is answered again from its completed gather: by value, if the
        # reference does not come (without an id, asking again would be a new gather)
        return await self.resolve(await ask(True), None if batch is None else lambda: ask(False))

    async def resolve(self, answer: Any,
                      again: Callable[[], Awaitable[Any]] | None = None) -> list[Any] | None:
        """A gather's answer as the coordinator sends it, read: fetched from the object
        store (``[reference]``), or the errors only, by value. ``again``: asks for the same
        answer by value, when the reference has not come within :data:`FETCH_S`."""
        if answer is None or isinstance(answer, ErrorsOnly):
            return None if answer is None else answer.values()
        if again is None:
            return await answer[0]
        try:
            return await asyncio.wait_for(_fetched(answer[0]), FETCH_S)
        except asyncio.TimeoutError:
            logger.warning("rayguard: a gather's answer did not come from the object store "
                           "in %.0f s: asked for again, by value", FETCH_S)
        return await again()

    async def gather_group(self, tag: str, world_size: int, batches: dict[str, dict[int, Any]],
                           timeout_s: float, keep: bool, full: bool, errors: bool) -> Any:
        """A relay's group of node batches (:mod:`rayguard.run.gather_relay`); the answers
        are passed on unread (each node fetches its own)."""
        return await self.actor.gather_group.remote(tag, world_size, batches, timeout_s, keep,
                                                    full, errors, True)

    async def wait_fact(self, key: str, timeout_s: float) -> Any:
        return await self.actor.wait_fact.remote(key, timeout_s)

    def summaries(self, batch: list[dict[str, Any]]) -> None:
        self.actor.step_summaries.remote(batch)

    async def answer_diagnosis_many(self, attempt: int,
                                    answers: dict[int, dict[str, Any]]) -> None:
        await self.actor.answer_diagnosis_many.remote(attempt, answers)

    async def deliver(self, messages: list[Message]) -> None:
        await self.actor.deliver.remote(messages)

    async def get_many(self, keys: list[str]) -> list[Any]:
        return list(await self.actor.get_many.remote(keys))

    async def claim(self, key: str) -> bool:
        return bool(await self.actor.claim.remote(key))

    async def memory_lookup_many(self, path: str, ranks: list[int]) -> list[Any]:
        return list(await self.actor.memory_lookup_many.remote(path, ranks))

    async def memory_copy_to_peer_many(self, path: str, ranks: list[int], world_size: int,
                                       wait_s: float, timeout_s: float) -> list[Any]:
        return list(await self.actor.memory_copy_to_peer_many.remote(
            path, ranks, world_size, wait_s, timeout_s))


__all__ = ["RayUpstream", "Upstream"]
