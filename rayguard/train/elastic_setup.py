"""Elastic geometry at worker start: gradient accumulation and rank remapping."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayguard.config import GuardConfig
from rayguard.train.context import GuardContext

if TYPE_CHECKING:
    from rayguard.train.session import WorkerSession


def apply_elastic(ctx: GuardContext, guard: GuardConfig, session: WorkerSession,
                  infos: list[dict[str, Any]]) -> None:
    if guard.global_batch_size is not None and guard.micro_batch_size is not None:
        from rayguard.elastic import grad_accum_steps

        ctx.grad_accum_steps = grad_accum_steps(guard.global_batch_size, guard.micro_batch_size,
                                                ctx.world_size)
