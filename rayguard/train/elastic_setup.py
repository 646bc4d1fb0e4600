"""Elastic geometry at worker start: gradient accumulation and where each worker came from.

``ctx.rank`` stays Ray Train's world rank (the rank of the torch process group: contiguous,
node then GPU order). A worker's identity across attempts is its slot (node, index on the
node, GPUs; :mod:`rayguard.elastic.remap`); ``ctx.previous_rank`` is the rank the same slot
held in the previous attempt (``None`` for a new worker), so rank-local state can follow it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayguard.config import GuardConfig
from rayguard.train.context import GuardContext

if TYPE_CHECKING:
    from rayguard.train.session import WorkerSession

ASSIGNMENT_KEY = "elastic_assignment"


def _gpu(gid: str) -> Any:
    return int(gid) if str(gid).isdigit() else gid


def previous_assignment(session: WorkerSession) -> dict[str, int] | None:
    """The previous attempt's ``slot key -> rank`` (read before this attempt stores its own)."""
    if session.coordinator is None:
        return None
    import ray

    return ray.get(session.coordinator.get.remote(ASSIGNMENT_KEY))


def apply_elastic(ctx: GuardContext, guard: GuardConfig, session: WorkerSession,
                  infos: list[dict[str, Any]], previous: dict[str, int] | None) -> None:
    from rayguard.elastic.remap import slot_key, slots_from_workers

    if guard.global_batch_size is not None and guard.micro_batch_size is not None:
        from rayguard.elastic import grad_accum_steps

        ctx.grad_accum_steps = grad_accum_steps(guard.global_batch_size, guard.micro_batch_size,
                                                ctx.world_size)
    slots = slots_from_workers([(i["node_id"], [_gpu(g) for g in i["gpu_ids"]]) for i in infos])
    current = {slot_key(s): rank for rank, s in enumerate(slots)}
    if previous:
        ctx.previous_rank = previous.get(slot_key(slots[ctx.rank]))
        ctx.world_size_changed = len(previous) != ctx.world_size
    if ctx.rank == 0 and session.coordinator is not None:
        session.coordinator.put.remote(ASSIGNMENT_KEY, current)
