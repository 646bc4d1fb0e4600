"""Ray Train internals for resizing a running worker group in place (live recovery on an
elastic run; the plan is :func:`rayguard.elastic.in_place.plan_resize`).

Ray Train's controller makes every size change a whole-group restart
(``TrainController._execute_resize_decision``). :class:`GuardController` asks rayguard's
controller callback first (its ``resize_in_place(controller, decision)``); where that says
it resized the group in place, the group keeps running, else Ray's restart runs as before.
The group is changed with the pieces Ray's own one-worker replacement uses
(``WorkerGroup.replace_replica_group``): replica groups shut down or started at bundles of
the group's placement group, the survivors' result queues cleared, the synchronization
actor reset, the train context initialised on new workers. The same actor's report barrier
is read and reset after Ray's own replacement of a replica group
(:mod:`rayguard.controller.replica_barrier`).

Relies on (Ray 2.59 and 2.60): ``TrainController._execute_resize_decision``,
``_run_controller_hook``, ``_get_run_attempt_id``, ``_state``, ``_worker_group``,
``_controller_callbacks``, ``_callbacks``, ``_worker_group_callbacks_to_propagate``;
``TrainControllerLoopIterationResult``; ``RunningState``;
``WorkerGroup``'s ``_replica_groups``, ``_worker_rank_to_replica_group_rank``,
``_world_rank_to_ongoing_poll``, ``_worker_group_state`` (``WorkerGroupState``: frozen,
``start_time``, ``placement_group_handle``, ``workers``, ``sync_actor``),
``_worker_group_context`` (frozen, ``num_workers``), ``_create_workers``,
``_worker_group_start_timeout_s``; ``DEFAULT_WORKER_GROUP_START_TIMEOUT_S`` of
``ray.train.v2._internal.constants``,
``_init_train_context``, ``_replica_group_callbacks``; ``ReplicaGroup``; a worker's
``clear_result_queue``; the sync actor's ``reset``, its ``_counter``,
``_sync_start_times`` and (2.60) ``_arrived_ranks``, read through ``__ray_call__``
(:func:`barrier_waiters`); the ``TrainController`` name that
``ray.train.v2.api.data_parallel_trainer`` starts its controller actor from
(:func:`started_from`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ray

from rayguard._ray import require_attrs, version_error

try:
    from ray.train.v2._internal.constants import DEFAULT_WORKER_GROUP_START_TIMEOUT_S
    from ray.train.v2._internal.execution.controller.controller import (
        TrainController,
        TrainControllerLoopIterationResult,
    )
    from ray.train.v2._internal.execution.controller.state import RunningState
    from ray.train.v2._internal.execution.worker_group.execution_group import ReplicaGroup
    from ray.train.v2._internal.execution.worker_group.state import WorkerGroupState
except ImportError as _exc:  # pragma: no cover - a Ray whose Train V2 internals moved
    raise version_error(f"a Train V2 internal ({_exc})", "elastic resize in place") from _exc

require_attrs(TrainController, ("_execute_resize_decision", "_run_controller_hook",
                                "_get_run_attempt_id"), "TrainController",
              "elastic resize in place")

logger = logging.getLogger("rayguard")

__all__ = ["GuardController", "align_replica_groups", "barrier_waiters", "free_bundles",
           "grow_group", "place_fields", "reset_barrier", "shrink_group", "start_new",
           "started_from", "survivors_cleared", "worker_start_s"]


class GuardController(TrainController):
    """Ray Train's controller under live recovery: its size changes rayguard's callback may
    make in place (an elastic run), and a worker replaced alone that meets another dead
    worker restarts the whole group instead of ending the run; a failed attempt's report
    that the replacement releases is dropped (:mod:`rayguard._ray.stale_reports`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from rayguard._ray.stale_reports import StaleReports

        guard = next((cb for cb in self._callbacks if hasattr(cb, "report_floor")), None)
        if guard is not None:  # before Ray's report handler (its first): no stale pairing
            self._worker_group_callbacks_to_propagate.insert(
                0, StaleReports(lambda: guard.report_floor))

    def _execute_resize_decision(self, decision: Any) -> Any:
        group, size = self._worker_group, int(decision.num_workers)
        resizer: Any = next((cb for cb in self._controller_callbacks
                             if hasattr(cb, "resize_in_place")), None)
        if resizer is None or group is None or not resizer.wants_resize(group, size):
            try:
                return super()._execute_resize_decision(decision)
            except ray.exceptions.RayActorError as exc:
                # a worker replaced alone (live recovery) found another worker of the group
                # dead too (its replacement calls every other worker first); Ray would end
                # the run with a ControllerError it never retries: the whole group restarts
                if resizer is not None:
                    resizer.replacement_failed(exc)
                return _restart(self, decision)
        failure = self._run_controller_hook("before_controller_execute_resize_decision",
                                            decision)
        if failure:
            return failure
        listeners = [cb for cb in (*self._worker_group_callbacks_to_propagate,
                                   *self._controller_callbacks)
                     if hasattr(cb, "after_resized_in_place")]

        def placed(worker_group: Any) -> None:
            for listener in dict.fromkeys(listeners):
                listener.after_resized_in_place(worker_group)

        if resizer.resize_in_place(group, size, placed):
            return TrainControllerLoopIterationResult(
                run_attempt_id=self._get_run_attempt_id(), previous_state=self._state,
                next_state=RunningState())
        return _restart(self, decision)


def _restart(controller: TrainController, decision: Any) -> Any:
    """Ray's whole-group restart at the decision's size (its hook already ran)."""
    controller._shutdown_worker_group()
    controller._start_worker_group(num_workers=decision.num_workers,
                                   resources_per_worker=decision.resources_per_worker)
    return TrainControllerLoopIterationResult(
        run_attempt_id=controller._get_run_attempt_id(), previous_state=controller._state,
        next_state=RunningState())


@contextmanager
def started_from(cls: type | None) -> Iterator[None]:
    """While the block runs, Ray Train's trainer starts its controller actor from ``cls``
    (the ``TrainController`` name its module reads when it starts one)."""
    if cls is None:
        yield
        return
    from ray.train.v2.api import data_parallel_trainer as module

    saved = module.TrainController
    setattr(module, "TrainController", cls)  # noqa: B010 - the name Ray's trainer reads
    try:
        yield
    finally:
        setattr(module, "TrainController", saved)  # noqa: B010


def free_bundles(worker_group: Any) -> list[int]:
    """Bundles of the group's placement group that no running worker holds."""
    state = worker_group._worker_group_state
    total = len(state.placement_group_handle.placement_group.bundle_specs)
    held = {w.placement_group_bundle_index for w in state.workers}
    return [i for i in range(total) if i not in held]


def _set_workers(worker_group: Any, workers: list[Any], groups: list[Any]) -> None:
    """The group now runs ``workers`` (in rank order), one replica group each."""
    state = worker_group._worker_group_state
    worker_group._worker_group_state = WorkerGroupState(
        start_time=time.monotonic(), placement_group_handle=state.placement_group_handle,
        workers=workers, sync_actor=state.sync_actor)
    worker_group._replica_groups = groups
    worker_group._worker_rank_to_replica_group_rank = {
        w.distributed_context.world_rank: i for i, w in enumerate(workers)}
    worker_group._worker_group_context = dataclasses.replace(
        worker_group._worker_group_context, num_workers=len(workers))
    worker_group._latest_poll_status = None


def align_replica_groups(worker_group: Any) -> None:
    """Put each worker's replica group at its world rank. Ray builds one group per worker in
    the order it created them, before ``before_init_train_context`` callbacks run; after
    rayguard's rank order moved the workers (a remap after a restart, NUMA order), group
    ``i`` held another rank's worker, and whatever goes by group index (Ray's replacement of
    a failed rank's group, whose new worker takes rank ``i``; a resize in place's shrink)
    stopped the wrong worker."""
    groups = list(getattr(worker_group, "_replica_groups", None) or [])
    workers = list(worker_group.get_workers())
    owner = {id(w): g for g in groups for w in g.get_workers()}
    if len(groups) != len(workers) or any(id(w) not in owner for w in workers):
        return  # no replica groups, or not one per worker (torchft's): Ray's order stands
    worker_group._replica_groups = [owner[id(w)] for w in workers]
    worker_group._worker_rank_to_replica_group_rank = {
        w.distributed_context.world_rank: i for i, w in enumerate(workers)}


def survivors_cleared(worker_group: Any, ranks: Sequence[int]) -> None:
    """Clear the result queues of the workers ``ranks`` (no report of the old size reaches
    the new one) and reset the group's synchronization actor (a survivor blocked at a
    barrier of the old size is released)."""
    workers = worker_group.get_workers()
    ray.get([workers[r].actor.clear_result_queue.remote() for r in ranks], timeout=60)
    reset_barrier(worker_group)


def reset_barrier(worker_group: Any) -> None:
    ray.get(worker_group._worker_group_state.sync_actor.reset.remote(), timeout=60)


def barrier_waiters(worker_group: Any, timeout_s: float = 10.0) -> tuple[list[int], float] | None:
    """The ranks waiting in the group's report barrier now and how long the first of them
    has waited (seconds): read inside Ray's synchronization actor (``None``: a Ray whose
    actor does not keep who waits)."""
    actor = worker_group._worker_group_state.sync_actor
    return ray.get(actor.__ray_call__.remote(_waiters), timeout=timeout_s)  # type: ignore[no-any-return]


def _waiters(actor: Any) -> tuple[list[int], float] | None:
    """Runs in the synchronization actor, off its event loop: copies (one step each under
    the GIL) of the ranks in the barrier (Ray 2.60's ``_arrived_ranks``; Ray 2.59 keeps only
    the arrival times of the ranks that wait) and of their arrival times (the loop's clock,
    ``time.monotonic``)."""
    import time as _time

    counter, starts = getattr(actor, "_counter", None), getattr(actor, "_sync_start_times", None)
    if not isinstance(counter, int) or not isinstance(starts, list):
        return None
    times, arrived = list(starts), getattr(actor, "_arrived_ranks", None)
    if counter <= 0:
        return [], 0.0
    ranks = (sorted(arrived.copy()) if isinstance(arrived, set)
             else [r for r, t in enumerate(times) if t is not None])
    began = [times[r] for r in ranks if 0 <= r < len(times) and times[r] is not None]
    return ranks, (_time.monotonic() - min(began)) if began else 0.0


def _place_all(workers: Sequence[Any]) -> None:
    """Every worker's distributed context for the group ``workers`` (rank order): world rank
    and size, local ranks and node rank over the whole group
    (:func:`rayguard.elastic.in_place.places`)."""
    from rayguard.elastic.in_place import places

    for worker, place in zip(workers, places([w.metadata.node_ip for w in workers]),
                             strict=True):
        worker.distributed_context = dataclasses.replace(worker.distributed_context,
                                                         **place.as_dict())


def place_fields(worker: Any) -> dict[str, int]:
    """A worker's place, as the resize's notice hands it to the worker."""
    ctx = worker.distributed_context
    return {"world_rank": ctx.world_rank, "world_size": ctx.world_size,
            "local_rank": ctx.local_rank, "local_world_size": ctx.local_world_size,
            "node_rank": ctx.node_rank}


def shrink_group(worker_group: Any, keep: Sequence[int]) -> None:
    """Keep the workers of old ranks ``keep`` (new rank ``i`` is ``keep[i]``) and shut down
    the others (lost, or stopped)."""
    align_replica_groups(worker_group)
    workers = list(worker_group.get_workers())
    groups = list(worker_group._replica_groups or [])
    kept = set(keep)
    for rank, group in enumerate(groups):
        if rank not in kept:
            try:
                group.shutdown()
            except Exception as exc:  # a dead worker's actor: nothing to stop
                logger.debug("rayguard: replica group %s shut down with %s", rank, exc)
    polls = worker_group._world_rank_to_ongoing_poll
    old_polls = dict(polls)
    polls.clear()
    for new_rank, old_rank in enumerate(keep):
        if old_rank in old_polls:
            polls[new_rank] = old_polls[old_rank]
    new_workers = [workers[r] for r in keep]
    _place_all(new_workers)
    _set_workers(worker_group, new_workers, [groups[r] for r in keep])


def grow_group(worker_group: Any, bundles: Sequence[int], wait_s: float,
               phases: dict[str, float] | None = None) -> list[Any]:
    """Start one worker actor at each placement-group bundle of ``bundles`` (new ranks after
    the running ones) once the placement group holds them (up to ``wait_s``), and give every
    worker its place in the grown group. Returns the new workers (their training function is
    started by :func:`start_new`). Raises where Ray does (a bundle not placed in time:
    ``GetTimeoutError``). ``phases``: filled with ``placed_s`` (the wait for the bundles) and
    ``workers_s`` (the new actors up)."""
    state = worker_group._worker_group_state
    pg = state.placement_group_handle.placement_group
    began = time.monotonic()
    ray.get(pg.ready(), timeout=wait_s)
    placed = time.monotonic()
    old = list(worker_group.get_workers())
    context = worker_group._worker_group_context
    new = worker_group._create_workers(
        num_workers=len(bundles), placement_group=pg,
        resources_per_worker=context.resources_per_worker,
        placement_group_bundle_indices=list(bundles), starting_world_rank=len(old),
        world_size=len(old) + len(bundles), replica_group_size=1)
    _place_all(old + new)
    groups = list(worker_group._replica_groups or []) + [
        ReplicaGroup([w], context.resources_per_worker, worker_group._replica_group_callbacks)
        for w in new]
    _set_workers(worker_group, old + new, groups)
    if phases is not None:
        phases.update(placed_s=placed - began, workers_s=time.monotonic() - placed)
    return new


def worker_start_s(worker_group: Any) -> float:
    """How long Ray Train gives a worker group to start (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``,
    Ray's default where the group does not say): the bound a grow in place allows its new
    workers' processes."""
    bound = getattr(worker_group, "_worker_group_start_timeout_s", None)
    return (float(bound) if isinstance(bound, (int, float)) and bound > 0
            else float(DEFAULT_WORKER_GROUP_START_TIMEOUT_S))


def start_new(worker_group: Any, new: Sequence[Any]) -> None:
    """Initialise the train context of the workers ``new`` and start their training
    function."""
    worker_group._init_train_context(list(new), worker_group._worker_group_state.sync_actor)
    groups = worker_group._replica_groups[len(worker_group.get_workers()) - len(new):]
    for group in groups:
        group.start_training(worker_group._worker_group_context)
