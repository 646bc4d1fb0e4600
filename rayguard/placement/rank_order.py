"""World ranks rayguard chooses: NUMA order on a first start, the elastic remapping policy
after a resize. A Ray Train worker-group hook applies them.

Ray Train groups ranks by node and sorts them by GPU id. Two things it does not do:

* NUMA order: when GPU numbering interleaves the sockets (GPUs 0, 2, 4, 6 on socket 0), GPU
  order is not NUMA order (:func:`rayguard.placement.numa.numa_rank_permutation`);
* keep ranks stable across restarts: after a resize, survivors keep their relative order
  and their rank where it still fits, new workers fill the lowest free ranks
  (:func:`rayguard.elastic.plan_ranks`).

The hook runs in Ray Train's controller after Ray assigned ranks and before any worker
learns its rank or joins the process group, and permutes the ranks (both planners are pure
functions). The controller keeps the hook across worker-group restarts, so it remembers the
previous attempt's assignment.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

logger = logging.getLogger("rayguard")


def _discover() -> Any:
    from rayguard.placement.topology import discover_topology

    return discover_topology()


def _numa_permutation(workers: list[Any]) -> list[int] | None:
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
        return None
    requests = [WorkerRequest(i, tuple(str(g) for g in w.metadata.gpu_ids),
                              float(w.resources.get("CPU", 0.0)))
                for i, w in enumerate(workers)]
    return numa_rank_permutation([w.metadata.node_id for w in workers], requests, topologies)


def _apply(workers: list[Any], perm: list[int]) -> None:
    """Give ``workers[perm[r]]`` world rank ``r`` (the distributed contexts move)."""
    contexts = [w.distributed_context for w in workers]
    reordered = [workers[i] for i in perm]
    for ctx, worker in zip(contexts, reordered, strict=True):
        worker.distributed_context = ctx
    workers[:] = reordered  # the same list Ray's worker-group state holds


class RankOrder(WorkerGroupCallback):
    """Runs in Ray Train's controller, once per worker-group start."""

    def __init__(self, numa: bool = True) -> None:
        self.numa = numa
        self._previous: dict[Any, int] | None = None

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        from rayguard.elastic.remap import plan_ranks, slots_from_workers

        if self._previous is None and self.numa and any(w.metadata.gpu_ids for w in workers):
            perm = _numa_permutation(workers)
            if perm and perm != list(range(len(workers))):
                _apply(workers, perm)
                logger.info("rayguard: world ranks in NUMA order: %s", perm)
        slots = slots_from_workers([(w.metadata.node_id, list(w.metadata.gpu_ids))
                                    for w in workers])
        if self._previous is not None:
            plan = plan_ranks(slots, self._previous)
            index = {slot: i for i, slot in enumerate(slots)}
            perm = [index[slot] for slot in plan.slots]
            if perm != list(range(len(workers))):
                _apply(workers, perm)
                slots = [slots[i] for i in perm]
                logger.info("rayguard: world ranks remapped after a restart: %s", perm)
        self._previous = {slot: rank for rank, slot in enumerate(slots)}
        return {}
