"""Where a worker runs: its NUMA binding and its CUDA device, from every rank's set-up facts
(:func:`rayguard.train.setup._setup_infos`: node, local rank, GPU ids, CPUs)."""

from __future__ import annotations

import logging
import os
from typing import Any

from rayguard.config import GuardConfig
from rayguard.placement.cuda import PinnedWorker, check_unique_devices, resolve_cuda_device
from rayguard.train.context import GuardContext

logger = logging.getLogger("rayguard")


def pin_cuda(ctx: GuardContext, infos: list[dict[str, Any]]) -> None:
    """This rank's CUDA device from the GPU ids Ray assigned it and its
    ``CUDA_VISIBLE_DEVICES`` (never ``local_rank`` arithmetic); a GPU given whole to two
    ranks of a node is an error."""
    import torch

    me = infos[ctx.rank]
    ctx.gpu_ids = tuple(me["gpu_ids"])
    check_unique_devices([PinnedWorker(i["rank"], i["node_id"], tuple(i["gpu_ids"]),
                                       i["fractional_gpu"]) for i in infos])
    if not ctx.gpu_ids:
        return
    if not torch.cuda.is_available():
        logger.warning("rank %s: Ray assigned GPUs %s but torch sees no CUDA device; running on "
                       "CPU (logical GPUs).", ctx.rank, list(ctx.gpu_ids))
        return
    placement = resolve_cuda_device(ctx.gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                    torch.cuda.device_count(), rank=ctx.rank, node=ctx.node_id)
    torch.cuda.set_device(placement.ordinal)
    ctx.device = torch.device(placement.device)


def bind_numa(ctx: GuardContext, guard: GuardConfig, infos: list[dict[str, Any]]) -> None:
    """This rank's NUMA binding from its node's plan. The node's ranks are told apart by
    Ray's local rank, or by their order on the node where Ray runs each worker as its own
    replica group (live recovery, ``TorchftConfig``: every local rank is 0)."""
    if guard.numa == "off":
        return
    from rayguard.placement.binding import setup_numa

    here = sorted((i for i in infos if i["node_id"] == ctx.node_id), key=lambda i: i["rank"])
    local = {i["rank"]: i["local_rank"] for i in here}
    if len(set(local.values())) < len(here):  # replica groups of one: Ray says 0 for each
        local = {i["rank"]: n for n, i in enumerate(here)}
    peers = [{"local_rank": local[i["rank"]], "gpu_ids": i["gpu_ids"], "num_cpus": i["num_cpus"]}
             for i in here]
    result = setup_numa(guard.numa, local[ctx.rank], peers)
    ctx.numa_node = result.numa_node
    ctx.cpu_affinity = tuple(result.cpu_affinity)


__all__ = ["bind_numa", "pin_cuda"]
