"""Ray Train internals in a worker: its place in a group resized in place
(:mod:`rayguard.controller.resize`).

Relies on (Ray 2.59 and 2.60): ``ray.train.v2._internal.execution.context.get_train_context``
(this process's ``TrainContext``, a mutable dataclass) and its ``distributed_context`` (a
dataclass with ``world_rank``, ``world_size``, ``local_rank``, ``local_world_size``,
``node_rank``), which ``ray.train.get_context()`` answers from.
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["apply_place"]


def apply_place(place: dict[str, int]) -> None:
    """This process's place in a resized group: Ray Train's context (what
    ``ray.train.get_context()`` answers) and the torch variables Ray sets."""
    from ray.train.v2._internal.execution.context import get_train_context

    train_ctx = get_train_context()
    train_ctx.distributed_context = dataclasses.replace(train_ctx.distributed_context, **place)
    os.environ.update({"RANK": str(place["world_rank"]), "WORLD_SIZE": str(place["world_size"]),
                       "LOCAL_RANK": str(place["local_rank"]),
                       "LOCAL_WORLD_SIZE": str(place["local_world_size"]),
                       "NODE_RANK": str(place["node_rank"])})
