"""World ranks in NUMA order: a Ray Train hook that reorders ranks within each node.

Ray Train already groups ranks by node and sorts them by GPU id. When GPU numbering
interleaves the sockets (GPUs 0, 2, 4, 6 on socket 0), GPU order is not NUMA order; this
hook, run by the controller after Ray assigned ranks and before any worker learns its rank
or joins the process group, permutes the ranks inside each node to follow the NUMA plan
(:func:`rayguard.placement.numa.numa_rank_permutation`, a pure function).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

logger = logging.getLogger("rayguard")


def _discover() -> Any:
    from rayguard.placement.topology import discover_topology

    return discover_topology()


class NumaRankOrder(WorkerGroupCallback):
    """Runs in Ray Train's controller, once per worker-group start."""

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        if not any(w.metadata.gpu_ids for w in workers):
            return {}  # CPU-only workers: nothing to order by
        import ray

        from rayguard.placement.numa import WorkerRequest, numa_rank_permutation

        probes: dict[str, Any] = {}
        for w in workers:
            probes.setdefault(w.metadata.node_id, w.execute_async(_discover))
        try:
            topologies = dict(zip(probes, ray.get(list(probes.values()), timeout=60), strict=True))
        except Exception as exc:  # placement is an optimisation: keep Ray's order
            logger.warning("rayguard: could not read node topologies (%s); keeping Ray's rank "
                           "order", exc)
            return {}
        requests = [WorkerRequest(i, tuple(str(g) for g in w.metadata.gpu_ids),
                                  float(w.resources.get("CPU", 0.0)))
                    for i, w in enumerate(workers)]
        perm = numa_rank_permutation([w.metadata.node_id for w in workers], requests, topologies)
        if perm == list(range(len(workers))):
            return {}
        contexts = [w.distributed_context for w in workers]
        reordered = [workers[i] for i in perm]
        for ctx, worker in zip(contexts, reordered, strict=True):
            worker.distributed_context = ctx
        workers[:] = reordered  # the same list Ray's worker-group state holds
        logger.info("rayguard: world ranks reordered to NUMA order: %s", perm)
        return {}
