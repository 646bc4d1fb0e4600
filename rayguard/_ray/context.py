"""A worker's place in Ray Train's own context, rewritten when its group is resized in place
(:mod:`rayguard.train.live`).

Relies on (Ray 2.59 and 2.60, see docs/compatibility.md): the worker's train context,
``ray.train.v2._internal.execution.context.get_train_context()``, whose
``distributed_context`` (a frozen ``DistributedContext``: ``world_rank``, ``world_size``,
``local_rank``, ``local_world_size``, ``node_rank``) is what ``ray.train.get_context()``
answers; the train context itself is not frozen.
"""

from __future__ import annotations

import dataclasses


def set_distributed_place(place: dict[str, int]) -> None:
    """This worker's world and local ranks and sizes, and node rank, in Ray Train's context
    (``place``: the fields of ``DistributedContext``)."""
    from ray.train.v2._internal.execution.context import get_train_context

    train_ctx = get_train_context()
    train_ctx.distributed_context = dataclasses.replace(train_ctx.distributed_context, **place)


__all__ = ["set_distributed_place"]
