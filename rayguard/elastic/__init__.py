"""Elastic training: a constant global batch, stable ranks and an exact data position across
resizes. Pure planners (:mod:`.geometry`, :mod:`.remap`, :mod:`.resharding`), the sampler
(:mod:`.sampler`) and the adapter to Ray's elastic scaling (:mod:`.scaling`, imported lazily
because it loads Ray Train internals). Guide: ``docs/elastic.md``.
"""

from __future__ import annotations

from typing import Any

from rayguard.elastic.geometry import (
    check_world_size,
    grad_accum_steps,
    largest_valid_at_most,
    scaled_lr,
    valid_world_sizes,
)
from rayguard.elastic.remap import (
    RankAssignment,
    WorkerSlot,
    assignment_from_state,
    plan_ranks,
    slot_key,
    slots_from_workers,
)
from rayguard.elastic.resharding import ReshardError, plan_state_sources
from rayguard.elastic.sampler import ElasticSampler

_LAZY = {"ValidSizeElasticPolicy", "make_scaling_policy", "valid_sizes_for"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rayguard.elastic import scaling

        return getattr(scaling, name)
    raise AttributeError(f"module 'rayguard.elastic' has no attribute {name!r}")


__all__ = [
    "ElasticSampler",
    "RankAssignment",
    "ReshardError",
    "ValidSizeElasticPolicy",
    "WorkerSlot",
    "assignment_from_state",
    "check_world_size",
    "grad_accum_steps",
    "largest_valid_at_most",
    "make_scaling_policy",
    "plan_ranks",
    "plan_state_sources",
    "scaled_lr",
    "slot_key",
    "slots_from_workers",
    "valid_sizes_for",
    "valid_world_sizes",
]
