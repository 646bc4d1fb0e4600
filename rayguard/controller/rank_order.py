"""World ranks rayguard chooses: NUMA order on a first start, the elastic remapping policy
after a resize. A Ray Train worker-group hook applies them.

Ray Train groups ranks by node and sorts them by GPU id. Two things it does not do:

* NUMA order: when GPU numbering interleaves the sockets (GPUs 0, 2, 4, 6 on socket 0), GPU
  order is not NUMA order (:func:`rayguard.placement.numa.numa_rank_permutation`);
* keep ranks stable across restarts: after a resize, survivors keep their relative order
  and their rank where it still fits, new workers fill the lowest free ranks
  (:func:`rayguard.elastic.remap.remap_permutation`).

The hook runs in Ray Train's controller after Ray assigned ranks and before any worker
learns its rank or joins the process group, and permutes the ranks (both planners are pure
functions returning a permutation; :func:`rayguard._ray.train.permute_workers` applies it).

The previous attempt's assignment has one home: the run coordinator's key-value store,
under :data:`rayguard.elastic.remap.ASSIGNMENT_KEY`. The hook reads it, plans, and writes the
new record before the workers start; the workers read the same record for
``ctx.previous_rank``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from rayguard._ray.train import (
    WorkerGroupCallback,
    permute_workers,
    probe_nodes,
    replaced_alone,
    restore_local_ranks,
    set_group_local_ranks,
    worker_slots,
)

logger = logging.getLogger("rayguard")


class Store(Protocol):
    """The part of the run coordinator's key-value store the hook uses (synchronous)."""

    def get(self, key: str) -> Any: ...

    def put(self, key: str, value: Any) -> None: ...


class CoordinatorStore:
    """:class:`Store` over the run coordinator actor (blocking calls, bounded)."""

    def __init__(self, coordinator: Any, timeout_s: float = 30.0) -> None:
        self.coordinator = coordinator
        self.timeout_s = timeout_s

    def get(self, key: str) -> Any:
        import ray

        return ray.get(self.coordinator.get.remote(key), timeout=self.timeout_s)

    def put(self, key: str, value: Any) -> None:
        import ray

        ray.get(self.coordinator.put.remote(key, value), timeout=self.timeout_s)


def _discover() -> Any:
    from rayguard.placement.topology import discover_topology

    return discover_topology()


def _numa_permutation(workers: list[Any]) -> list[int] | None:
    from rayguard.placement.numa import WorkerRequest, numa_rank_permutation

    try:
        topologies = probe_nodes(workers, _discover, timeout_s=60)
    except Exception as exc:  # placement is an optimisation: keep Ray's order
        logger.warning("rayguard: could not read node topologies (%s); keeping Ray's rank "
                       "order", exc)
        return None
    slots = worker_slots(workers)
    requests = [WorkerRequest(i, tuple(str(g) for g in gpus), cpus)
                for i, (_, gpus, cpus) in enumerate(slots)]
    return numa_rank_permutation([node for node, _, _ in slots], requests, topologies)


class RankOrder(WorkerGroupCallback):
    """Runs in Ray Train's controller, once per worker-group start. ``store``: where the
    rank-assignment record lives (``None``: no record, every start is a first start).
    ``group_local_ranks``: every worker is its own replica group (live recovery), so the
    local ranks are set among the whole group, as without replica groups; a worker replaced
    alone keeps its rank (Ray's) and the assignment record is left as the group's start
    wrote it."""

    def __init__(self, numa: bool = True, store: Store | None = None, *,
                 group_local_ranks: bool = False) -> None:
        self.numa = numa
        self.store = store
        self.group_local_ranks = group_local_ranks
        self._contexts: dict[int, Any] = {}

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        from rayguard.elastic.remap import (
            ASSIGNMENT_KEY,
            assignment_from_state,
            remap_permutation,
            slots_from_workers,
        )

        if replaced_alone(workers):
            if self.group_local_ranks:
                restore_local_ranks(workers, self._contexts)
            return {}
        record = self._read(ASSIGNMENT_KEY)
        previous = record.get("current") if record else None
        if previous is None and self.numa and any(gpus for _, gpus, _ in worker_slots(workers)):
            perm = _numa_permutation(workers)
            if perm and perm != list(range(len(workers))):
                permute_workers(workers, perm)
                logger.info("rayguard: world ranks in NUMA order: %s", perm)
        slots = slots_from_workers([(node, gpus) for node, gpus, _ in worker_slots(workers)])
        if previous is not None:
            perm = remap_permutation(slots, assignment_from_state(previous))
            if perm != list(range(len(workers))):
                permute_workers(workers, perm)
                slots = [slots[i] for i in perm]
                logger.info("rayguard: world ranks remapped after a restart: %s", perm)
        if self.group_local_ranks:
            self._contexts = set_group_local_ranks(workers)
        self._store_assignment(record, slots)
        return {}

    def after_resized_in_place(self, worker_group: Any) -> None:
        """A group resized in place (:mod:`rayguard.controller.resize`): its workers'
        places are those a worker replaced alone later takes again, and the assignment
        record says where each rank was before."""
        from rayguard.elastic.remap import ASSIGNMENT_KEY, slots_from_workers

        workers = worker_group.get_workers()
        self._contexts = {w.distributed_context.world_rank: w.distributed_context
                          for w in workers}
        slots = slots_from_workers([(node, gpus) for node, gpus, _ in worker_slots(workers)])
        self._store_assignment(self._read(ASSIGNMENT_KEY), slots)

    def after_worker_group_start(self, worker_group: Any) -> None:
        """Each worker's replica group at its world rank, once the workers are in rank
        order (:func:`rayguard._ray.resize.align_replica_groups`)."""
        from rayguard._ray.resize import align_replica_groups

        align_replica_groups(worker_group)

    def _store_assignment(self, record: Any, slots: list[Any]) -> None:
        from rayguard.elastic.remap import ASSIGNMENT_KEY, next_record

        if self.store is None:
            return
        try:
            self.store.put(ASSIGNMENT_KEY, next_record(record, slots))
        except Exception as exc:  # the coordinator died: the run is failing anyway
            logger.warning("rayguard: could not store the rank assignment: %s", exc)

    def _read(self, key: str) -> Any:
        if self.store is None:
            return None
        try:
            return self.store.get(key)
        except Exception as exc:  # keep Ray's order rather than fail the start
            logger.warning("rayguard: could not read the previous rank assignment: %s", exc)
            return None
