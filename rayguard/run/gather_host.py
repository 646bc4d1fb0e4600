"""The coordinator's gathers: the one collective rayguard needs outside torch.distributed.

A mixin of :class:`~rayguard.run.coordinator.RunCoordinator` (the actor), kept apart so that
the gathers read in one place: a rank's own call (:meth:`GatherHost.gather`, a small run), a
node agent's call for its node's ranks (:meth:`GatherHost.gather_many`) and a relay's call
for its group's nodes (:meth:`GatherHost.gather_group`, :mod:`rayguard.run.gather_relay`).
The waits themselves are :class:`~rayguard.run.waits.GatherBoard`'s, the answers' forms
:class:`~rayguard.run.waits.Answers`'.
"""

from __future__ import annotations

from typing import Any

from rayguard.run.waits import Answers, GatherBoard, GroupAnswer, bounded


class GatherHost:
    """The gather methods of the coordinator actor (call :meth:`_init_gathers` first; every
    method runs on the actor's event loop)."""

    def _init_gathers(self) -> None:
        self._gathers = GatherBoard()
        self._answers = Answers()

    async def gather(self, tag: str, rank: int, world_size: int, value: Any,
                     timeout_s: float = 1800.0, keep: bool = False, root: int | None = None
                     ) -> list[Any] | None:
        """Every rank's value for ``tag`` in rank order once ``world_size`` ranks have called;
        ``None`` on timeout or when a live recovery released the attempt (a rank died: Ray
        replaces it or restarts the group). ``keep``: see
        :class:`~rayguard.run.waits.GatherBoard`; ``root``: only that rank gets every value,
        the others :func:`~rayguard.run.waits.errors_only`."""
        return await self.gather_many(tag, world_size, {rank: value}, timeout_s, keep,
                                      root=root)

    async def gather_many(self, tag: str, world_size: int, values: dict[int, Any],
                          timeout_s: float = 1800.0, keep: bool = False, by_ref: bool = False,
                          root: int | None = None, batch: str | None = None) -> Any:
        """:meth:`gather` for several ranks at once (a node's agent: one call per node): the
        whole answer when ``root`` is None or one of ``values``, else the errors only.
        ``by_ref``: the answer as ``[reference]``, put into the object store once for every
        node that asks (errors only: :class:`~rayguard.run.waits.ErrorsOnly`, by value).
        ``batch``: the node batch's id, when a copy of it may also come through its relay
        (joined once, :class:`~rayguard.run.waits.GatherBoard`)."""
        result = await bounded(self._gathers.join(tag, world_size, values, keep=keep,
                                                  batch=batch), timeout_s)
        if result is None:
            return None
        return self._answers.answer(result, full=root is None or root in values, by_ref=by_ref)

    async def gather_group(self, tag: str, world_size: int,
                           batches: dict[str, dict[int, Any]], timeout_s: float = 1800.0,
                           keep: bool = False, full: bool = True, errors: bool = False,
                           by_ref: bool = False) -> GroupAnswer | None:
        """Several nodes' batches at once (``{batch id: {rank: value}}``: a relay's group,
        :mod:`rayguard.run.gather_relay`), each joined once; the answer in the forms its
        nodes need (``full``: some node needs every value, ``errors``: some only the
        errors), ``None`` as for :meth:`gather`."""
        result = await bounded(self._gathers.join_batches(tag, world_size, batches, keep=keep),
                               timeout_s)
        if result is None:
            return None
        answers = self._answers
        return GroupAnswer(answers.answer(result, full=True, by_ref=by_ref) if full else None,
                           answers.answer(result, full=False, by_ref=by_ref) if errors else None)


__all__ = ["GatherHost"]
