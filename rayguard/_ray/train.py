"""Ray Train V2 internals: what rayguard's controller-side code and ``RobustTrainer`` build on.

Relies on (checked at import; all present in Ray 2.59 and 2.60, see docs/compatibility.md):

* ``ray.train.v2._internal.execution.callback``: ``ControllerCallback`` and
  ``WorkerGroupCallback`` with the hooks ``before_worker_group_start``,
  ``before_init_train_context(workers)``, ``after_worker_group_poll_status`` and
  ``before_controller_execute_failure_decision``;
* the worker records handed to ``before_init_train_context``: ``metadata.node_id``,
  ``metadata.gpu_ids``, ``resources``, ``execute_async(fn)``, ``distributed_context``, and
  the fact that the list is the one the worker-group state holds (reordering it in place
  reorders the ranks; :func:`permute_workers`);
* the worker group handed to ``after_worker_group_start``: ``get_workers()`` in rank order
  (:func:`group_nodes`); the ``WorkerGroupContext`` handed to ``before_worker_group_start``
  (a frozen dataclass) with ``label_selector`` (one dict per worker, or ``None``) and
  ``num_workers``, read by the placement group created right after the hook
  (:func:`set_group_label_selector`);
* ``failure_handling.FailureDecision`` and ``failure_handling.default.DefaultFailurePolicy``;
* ``scaling_policy``: ``ElasticScalingPolicy`` with the private ``_count_possible_workers``,
  ``_get_reserved_resources``, ``_latest_reserved_resources(_query_time)``,
  ``_autoscaling_coordinator``, ``_requester_id`` and ``GET_RESERVED_RESOURCES_INTERVAL_S``;
  ``create_scaling_policy``, ``ScalingDecision``, ``ScalingPolicy``;
  ``autoscaling_coordinator_client.AUTOSCALING_REQUESTS_GET_TIMEOUT_S``;
  ``ray.train.v2._internal.util.time_monotonic``. The coordinator's
  ``get_reserved_resources(recompute=True)`` exists from Ray 2.60 only: on 2.59 the policy
  falls back to the plain (up to 20 s old) view;
* ``TorchTrainer``'s private ``_get_train_func``, ``_create_default_callbacks`` and
  ``_initialize_and_run_controller(**kwargs)`` (with ``failure_policy=`` and
  ``scaling_policy=``), which :class:`GuardHooksTrainer` overrides;
* a worker failure wraps the user's exception in a Ray error with ``_base_exc``
  (:func:`unwrap_worker_error`);
* ``ray.train.v2._internal.constants.ENV_VARS_TO_PROPAGATE``, the set of variables Ray Train
  copies from the driver's environment into the controller's ``runtime_env`` when it starts
  the controller (``_initialize_and_run_controller``); actors the controller starts without
  a ``runtime_env`` of their own (the detached ``PlacementGroupCleaner``) inherit it
  (:func:`controller_env`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import ray

from rayguard._ray import require_attrs, version_error

try:
    from ray.train.v2._internal import constants as _train_constants
    from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
    from ray.train.v2._internal.execution.failure_handling import FailureDecision
    from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
    from ray.train.v2._internal.execution.scaling_policy import (
        ElasticScalingPolicy,
        FixedScalingPolicy,
        NoopDecision,
        ScalingDecision,
        ScalingPolicy,
        create_scaling_policy,
    )
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
    )
    from ray.train.v2._internal.util import time_monotonic
    from ray.train.v2.torch.torch_trainer import TorchTrainer
except ImportError as _exc:  # a Ray whose Train V2 internals moved
    raise version_error(f"a Train V2 internal ({_exc})", "RobustTrainer") from _exc

require_attrs(WorkerGroupCallback, ("before_worker_group_start", "before_init_train_context",
                                    "after_worker_group_poll_status"),
              "WorkerGroupCallback", "RobustTrainer's controller hooks")
require_attrs(ControllerCallback, ("before_controller_execute_failure_decision",),
              "ControllerCallback", "RobustTrainer's controller hooks")
require_attrs(ElasticScalingPolicy, ("_count_possible_workers", "_get_reserved_resources",
                                     "GET_RESERVED_RESOURCES_INTERVAL_S"),
              "ElasticScalingPolicy", "elastic world sizes (GuardConfig(global_batch_size=))")
require_attrs(_train_constants, ("ENV_VARS_TO_PROPAGATE",), "ray.train.v2._internal.constants",
              "RobustTrainer's controller environment")
require_attrs(TorchTrainer, ("_get_train_func", "_create_default_callbacks",
                             "_initialize_and_run_controller"), "TorchTrainer", "RobustTrainer")

if TYPE_CHECKING:
    from ray.train.v2.api.config import ScalingConfig

logger = logging.getLogger("rayguard")

__all__ = [
    "ControllerCallback", "DefaultFailurePolicy", "FailureDecision", "FixedScalingPolicy",
    "GuardHooksTrainer", "NoopDecision", "QuietRetryPolicy", "RoundingElasticPolicy",
    "ScalingPolicy", "WorkerGroupCallback", "controller_env", "create_scaling_policy",
    "fail_every_worker", "fail_workers", "group_nodes", "marked_failed", "permute_workers",
    "probe_nodes", "replaced_alone", "replacement_met_a_dead_worker", "reserved_resources",
    "resources_per_worker", "restore_local_ranks", "set_group_label_selector", "set_group_local_ranks",
    "unwrap_worker_error", "worker_slots",
]


# -- errors ------------------------------------------------------------------------------
def unwrap_worker_error(error: BaseException) -> BaseException:
    """The user's exception inside the Ray error a worker failure arrives as."""
    return getattr(error, "_base_exc", error)


# -- the failure policy's console dump ------------------------------------------------------
class QuietRetryPolicy(DefaultFailurePolicy):
    """Ray's failure policy whose dump of a failure it retries (``_log_decision``: the
    worker's whole error and traceback, about 80 console lines) shows only at
    ``RAYGUARD_LOG_LEVEL=DEBUG``: rayguard's own lines (``worker_died``, ``restart``) say
    what happened and the event log keeps the whole text. A decision that ends the run is
    logged as Ray logs it. A Ray without ``_log_decision`` logs as before."""

    def _log_decision(self, decision: Any, *args: Any, **kwargs: Any) -> None:
        from rayguard.logs import log_level

        if decision == FailureDecision.RETRY and log_level() > logging.DEBUG:
            return
        super()._log_decision(decision, *args, **kwargs)  # type: ignore[misc]

    def retry_as_worker_failure(self) -> FailureDecision:
        """Count a failure as a worker group's (``FailureConfig(max_failures)``): RETRY, a
        whole-group restart, while the budget lasts, else RAISE."""
        self._worker_group_failures += 1
        limit = self.failure_config.max_failures
        if limit != -1 and self._worker_group_failures > limit:
            return FailureDecision.RAISE
        return FailureDecision.RETRY


def replacement_met_a_dead_worker(error: Any) -> bool:
    """Whether ``error`` is Ray's controller failing to replace a worker alone because
    another worker of the group had died too (its replica-group replacement calls every
    other worker first: ``clear_result_queue``), not yet seen by a poll."""
    from ray.exceptions import RayActorError
    from ray.train import ControllerError

    return isinstance(error, ControllerError) and isinstance(
        getattr(error, "controller_failure", None), RayActorError)


# -- the worker list of before_init_train_context -------------------------------------------
def worker_slots(workers: Sequence[Any]) -> list[tuple[str, list[Any], float]]:
    """``(node_id, gpu_ids, cpus)`` of each worker, in Ray's rank order."""
    return [(w.metadata.node_id, list(w.metadata.gpu_ids), float(w.resources.get("CPU", 0.0)))
            for w in workers]


def probe_nodes(workers: Sequence[Any], fn: Callable[[], Any], timeout_s: float) -> dict[str, Any]:
    """``fn()`` run once per node (in the first worker there), by node id. Raises what
    ``ray.get`` raises (a dead worker, a timeout)."""
    probes: dict[str, Any] = {}
    for w in workers:
        probes.setdefault(w.metadata.node_id, w.execute_async(fn))
    return dict(zip(probes, ray.get(list(probes.values()), timeout=timeout_s), strict=True))


def group_nodes(worker_group: Any) -> list[str]:
    """The node id of each worker of a started group (``after_worker_group_start``), in
    rank order."""
    return [w.metadata.node_id for w in worker_group.get_workers()]


_MARK = "_rayguard_marked_failed"


def fail_every_worker(worker_group_status: Any, error: BaseException) -> None:
    """Mark every worker of a poll (``after_worker_group_poll_status``; the controller acts
    on this same object) that has not failed as failed with ``error``: Ray's controller then
    restarts the whole group instead of replacing the failed replica groups alone (its
    ``_execute_resize_decision`` replaces them alone only while some replica group has not
    failed). ``error`` is marked (:func:`marked_failed`)."""
    fail_workers(worker_group_status, worker_group_status.worker_statuses, error)


def fail_workers(worker_group_status: Any, ranks: Any, error: BaseException) -> None:
    """Mark the workers ``ranks`` of a poll that have not failed as failed with ``error``
    (marked: :func:`marked_failed`), so that the controller acts on them at this poll."""
    setattr(error, _MARK, True)
    for rank in ranks:
        status = worker_group_status.worker_statuses.get(rank)
        if status is not None and status.error is None:
            status.error = error


def marked_failed(error: BaseException) -> bool:
    """Whether ``error`` is the mark :func:`fail_every_worker` left, not a worker's own
    failure."""
    return bool(getattr(unwrap_worker_error(error), _MARK, False))


def group_label_selector(worker_group_context: Any) -> tuple[list[dict[str, str]] | None, int]:
    """``(label_selector, num_workers)`` of the group about to start
    (``before_worker_group_start``)."""
    return worker_group_context.label_selector, int(worker_group_context.num_workers)


def resources_per_worker(scaling_config: Any) -> dict[str, float]:
    """One worker's resources as Ray places it (its defaults filled in)."""
    return dict(scaling_config._resources_per_worker_not_none)


def set_group_label_selector(worker_group_context: Any, selectors: list[dict[str, str]] | None) -> None:
    """Place the group about to start with ``selectors`` (one per worker): the placement
    group Ray creates right after ``before_worker_group_start`` reads them."""
    object.__setattr__(worker_group_context, "label_selector", selectors)


def permute_workers(workers: list[Any], perm: Sequence[int]) -> None:
    """Give ``workers[perm[r]]`` world rank ``r``: the distributed contexts stay in place and
    the workers move, in the very list Ray's worker-group state holds."""
    contexts = [w.distributed_context for w in workers]
    reordered = [workers[i] for i in perm]
    for ctx, worker in zip(contexts, reordered, strict=True):
        worker.distributed_context = ctx
    workers[:] = reordered


def replaced_alone(workers: Sequence[Any]) -> bool:
    """Whether ``workers`` (``before_init_train_context``) are a replica group Ray replaces
    alone, not a whole group's start."""
    return bool(workers) and len(workers) < workers[0].distributed_context.world_size


def set_group_local_ranks(workers: Sequence[Any]) -> dict[int, Any]:
    """Give every worker of a whole group's start (in world-rank order) the local rank,
    local world size and node rank it has among all the group's workers, as Ray computes
    them without replica groups (grouped by node IP); returns each world rank's context.
    Ray computes them per replica group, so a group of one-worker replica groups (live
    recovery) would have every rank at local rank 0: every worker on one GPU. The arithmetic
    is :func:`rayguard.elastic.in_place.places`' (a resize in place uses it too)."""
    import dataclasses

    from rayguard.elastic.in_place import places

    contexts = {}
    for worker, place in zip(workers, places([w.metadata.node_ip for w in workers]),
                             strict=True):
        worker.distributed_context = dataclasses.replace(
            worker.distributed_context, local_rank=place.local_rank,
            local_world_size=place.local_world_size, node_rank=place.node_rank)
        contexts[worker.distributed_context.world_rank] = worker.distributed_context
    return contexts


def restore_local_ranks(workers: Sequence[Any], contexts: dict[int, Any]) -> None:
    """A replaced worker takes the context its world rank had at the group's start (same
    placement-group bundle, same node): :func:`set_group_local_ranks`'."""
    for worker in workers:
        saved = contexts.get(worker.distributed_context.world_rank)
        if saved is not None:
            worker.distributed_context = saved


# -- the scaling policy ----------------------------------------------------------------------
def reserved_resources(per_node: Sequence[dict[str, float]],
                       node_ids: Sequence[str] | None = None) -> Any:
    """Reservations in the shape Ray's autoscaling coordinator returns them: a dict by node
    on Ray 2.60 (``ReservedResources``; keyed by ``node_ids`` when given), a list on 2.59
    (what ``_count_possible_workers`` takes)."""
    try:
        from ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator import (  # noqa: F401
            ReservedResources,
        )
    except ImportError:  # Ray 2.59
        return [dict(r) for r in per_node]
    ids = list(node_ids) if node_ids is not None else [f"node{i}" for i in range(len(per_node))]
    return {node: dict(r) for node, r in zip(ids, per_node, strict=True)}


class RoundingElasticPolicy(ElasticScalingPolicy):
    """Ray's elastic policy whose worker count goes through ``choose(possible) -> count``,
    and that asks the coordinator for a fresh view of the cluster after a failure.

    ``choose`` must pickle (the policy is sent to the controller actor)."""

    def __init__(self, scaling_config: ScalingConfig, choose: Callable[[int], int],
                 fresh_cluster_view: bool = True,
                 excluded: Callable[[], Collection[str]] | None = None) -> None:
        super().__init__(scaling_config)
        self.choose = choose
        self.excluded = excluded
        """``() -> node ids`` whose reserved resources are not counted (quarantined nodes;
        must pickle). Only with Ray 2.60's per-node reservations (a dict by node id)."""
        self.fresh_cluster_view = fresh_cluster_view
        """Ask the coordinator to recompute reservations against live nodes on each query."""
        self._was_running = False

    def make_decision_for_running_worker_group(self, worker_group_state: Any,
                                               worker_group_status: Any) -> ScalingDecision:
        self._was_running = True
        return super().make_decision_for_running_worker_group(worker_group_state, worker_group_status)

    def make_decision_for_non_running_worker_group(self) -> ScalingDecision:
        if self._was_running and self.fresh_cluster_view:
            # The group just failed or is being resized: the reservation cached by the running
            # group's monitor (up to 1 s old) still counts a node that may have just died.
            self._was_running = False
            self._latest_reserved_resources_query_time = float("-inf")
        return super().make_decision_for_non_running_worker_group()

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        if self.excluded is not None and isinstance(reserved_resources, dict):
            left_out = set(self.excluded())
            reserved_resources = {n: r for n, r in reserved_resources.items() if n not in left_out}
        return self.choose(super()._count_possible_workers(reserved_resources))

    def _get_reserved_resources(self) -> Any:
        if not self.fresh_cluster_view:
            return super()._get_reserved_resources()
        now = time_monotonic()
        if now - self._latest_reserved_resources_query_time < self.GET_RESERVED_RESOURCES_INTERVAL_S:
            return self._latest_reserved_resources
        coordinator = self._autoscaling_coordinator
        reserved = None
        try:
            reserved = ray.get(
                coordinator.get_reserved_resources.remote(self._requester_id, recompute=True),
                timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S)
        except TypeError:  # Ray 2.59: no ``recompute``; the plain query
            self.fresh_cluster_view = False
            return super()._get_reserved_resources()
        except Exception:
            logger.warning("rayguard: failed to get reserved resources for %s; not resizing now",
                           self._requester_id, exc_info=True)
        finally:
            self._latest_reserved_resources_query_time = time_monotonic()
        self._latest_reserved_resources = reserved
        return reserved


# -- the controller's environment ---------------------------------------------------------
@contextmanager
def controller_env(values: dict[str, str]) -> Iterator[None]:
    """While the block runs, ``values`` are set in this (the driver's) environment and named
    in Ray Train's ``ENV_VARS_TO_PROPAGATE``, so that the controller Ray Train starts there
    gets them in its ``runtime_env`` (and so does every actor it starts without one of its
    own). Both are restored when the block ends."""
    names = _train_constants.ENV_VARS_TO_PROPAGATE
    added = [k for k in values if k not in names]
    saved = {k: os.environ.get(k) for k in values}
    names.update(added)
    os.environ.update(values)
    try:
        yield
    finally:
        names.difference_update(added)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- TorchTrainer's private hooks ---------------------------------------------------------------
class GuardHooksTrainer(TorchTrainer):
    """``TorchTrainer`` with its private hooks turned into public ones a subclass
    overrides: :meth:`wrap_train_func`, :meth:`controller_callbacks`,
    :meth:`controller_policies`, :meth:`controller_env_vars`, :meth:`controller_class`."""

    def wrap_train_func(self, train_func: Callable[..., Any]) -> Callable[..., Any]:
        """The function each worker runs, given the one Ray Train would run."""
        return train_func

    def controller_callbacks(self, callbacks: list[Any]) -> list[Any]:
        """The controller's callbacks, given Ray Train's defaults."""
        return callbacks

    def controller_policies(self) -> dict[str, Any]:
        """``failure_policy`` and/or ``scaling_policy`` for the controller (absent: Ray's)."""
        return {}

    def controller_env_vars(self) -> dict[str, str]:
        """Variables set in the controller's environment (and the actors it starts)."""
        return {}

    def controller_class(self) -> type | None:
        """The controller actor's class, a subclass of Ray Train's ``TrainController``
        (``None``: Ray's own)."""
        return None

    def _get_train_func(self):
        return self.wrap_train_func(super()._get_train_func())

    def _create_default_callbacks(self):
        return self.controller_callbacks(super()._create_default_callbacks())

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any):
        controller_init_kwargs.update(self.controller_policies())
        from rayguard._ray.resize import started_from
        from rayguard._ray.sigint import sigint_handler_kept

        with controller_env(self.controller_env_vars()), started_from(self.controller_class()), \
                sigint_handler_kept():
            return super()._initialize_and_run_controller(**controller_init_kwargs)

