"""Elastic geometry at worker start: gradient accumulation and where each worker came from.

``ctx.rank`` stays Ray Train's world rank (the rank of the torch process group: contiguous,
node then GPU order). A worker's identity across attempts is its slot (node, index on the
node, GPUs; :mod:`rayguard.elastic.remap`); ``ctx.previous_rank`` is the rank the same slot
held in the previous attempt (``None`` for a new worker), so rank-local state can follow it.
Both come from the rank-assignment record the controller's rank-order hook
(:mod:`rayguard.controller.rank_order`) writes before the workers start: the one source.
"""

from __future__ import annotations

from typing import Any

from rayguard.config import GuardConfig
from rayguard.run.link import RunLink
from rayguard.train.context import GuardContext


def previous_assignment(link: RunLink) -> dict[str, Any] | None:
    """This attempt's rank-assignment record (``{"previous": ..., "current": ...}``, see
    :data:`rayguard.elastic.remap.ASSIGNMENT_KEY`), or None without a coordinator."""
    from rayguard.elastic.remap import ASSIGNMENT_KEY

    return link.get(ASSIGNMENT_KEY)


def apply_elastic(ctx: GuardContext, guard: GuardConfig, record: dict[str, Any] | None) -> None:
    """Set ``ctx.grad_accum_steps`` and, from the controller's ``record``,
    ``ctx.previous_rank`` / ``ctx.world_size_changed``."""
    from rayguard.elastic.remap import previous_rank_of

    if guard.global_batch_size is not None and guard.micro_batch_size is not None:
        from rayguard.elastic import grad_accum_steps

        ctx.grad_accum_steps = grad_accum_steps(guard.global_batch_size, guard.micro_batch_size,
                                                ctx.world_size)
    previous_rank, previous_world_size = previous_rank_of(record, ctx.rank)
    if previous_world_size is not None:
        ctx.previous_rank = previous_rank
        ctx.world_size_changed = previous_world_size != ctx.world_size
