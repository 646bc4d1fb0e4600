"""Elastic training: a constant global batch, stable ranks and an exact data position across
resizes. Pure planners (:mod:`.geometry`, :mod:`.remap`, :mod:`.resharding`), the sampler
(:mod:`.sampler`). The adapter to Ray's elastic scaling runs in Ray Train's controller:
:mod:`rayguard.controller.scaling`. Guide: ``docs/elastic.md``.
"""

from __future__ import annotations

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
    plan_ranks,
)
from rayguard.elastic.resharding import ReshardError, plan_state_sources
from rayguard.elastic.sampler import ElasticSampler

__all__ = [
    "ElasticSampler",
    "RankAssignment",
    "ReshardError",
    "WorkerSlot",
    "check_world_size",
    "grad_accum_steps",
    "largest_valid_at_most",
    "plan_ranks",
    "plan_state_sources",
    "scaled_lr",
    "valid_world_sizes",
]
