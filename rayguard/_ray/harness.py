"""Ray Train V2's real controller in this process, with a scripted worker group: the Ray side
of :mod:`rayguard.testing.controller`. No cluster, no actor, no ``ray.init``.

Relies on (checked at import; Ray 2.60, as Ray's own ``tests/test_controller.py`` drives it):

* ``TrainController(train_fn_ref, train_run_context, scaling_policy, failure_policy,
  callbacks)``, its class attribute ``worker_group_cls``, the coroutine
  ``_run_control_loop_iteration()`` (one step of its state machine), ``get_state()``,
  ``get_result()``, and the environment variables it reads at construction
  (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER``,
  ``RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING``);
* the ``WorkerGroup`` interface the controller calls (``create``, ``poll_status``,
  ``shutdown``, ``abort``, ``get_workers``, ``get_worker_group_state``,
  ``get_latest_poll_status``, ``replace_replica_group``) and the worker-group callback hooks
  a real group calls (``before_worker_group_start``, ``before_init_train_context``,
  ``after_worker_group_start``, ``after_worker_group_poll_status``,
  ``before/after_worker_group_shutdown``);
* ``WorkerGroupPollStatus``, ``WorkerStatus``, ``WorkerGroupState``, ``DistributedContext``,
  ``ObjectRefWrapper``; the worker errors ``UserExceptionWithTraceback`` (a raised exception)
  and ``WorkerHealthCheckFailedError`` (a dead worker), ``WorkerGroupStartupTimeoutError``;
* ``autoscaling_coordinator_client.get_or_create_autoscaling_coordinator`` (replaced by the
  scripted cluster's reservations while the controller runs).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from rayguard._ray import require_attrs, version_error
from rayguard._ray.train import reserved_resources

try:
    from ray.train.v2._internal import constants as _constants
    from ray.train.v2._internal.exceptions import (
        UserExceptionWithTraceback,
        WorkerGroupStartupTimeoutError,
        WorkerHealthCheckFailedError,
    )
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
    from ray.train.v2._internal.execution.context import DistributedContext
    from ray.train.v2._internal.execution.controller import TrainController
    from ray.train.v2._internal.execution.scaling_policy import (
        autoscaling_coordinator_client as _autoscaling,
    )
    from ray.train.v2._internal.execution.worker_group import (
        WorkerGroup,
        WorkerGroupPollStatus,
        WorkerGroupState,
        WorkerStatus,
    )
    from ray.train.v2._internal.util import ObjectRefWrapper, time_monotonic
except ImportError as _exc:  # a Ray whose Train V2 internals moved
    raise version_error(f"a Train V2 internal ({_exc})", "rayguard.testing.controller") from _exc

require_attrs(TrainController, ("worker_group_cls", "_run_control_loop_iteration", "get_state",
                                "get_result"), "TrainController", "rayguard.testing.controller")
require_attrs(_constants, ("HEALTH_CHECK_INTERVAL_S_ENV_VAR", "ENABLE_PREEMPTION_WATCHER_ENV_VAR",
                           "ENABLE_CONTROLLER_STRUCTURED_LOGGING_ENV_VAR"),
              "ray.train.v2._internal.constants", "rayguard.testing.controller")
require_attrs(_autoscaling, ("get_or_create_autoscaling_coordinator",),
              "autoscaling_coordinator_client", "rayguard.testing.controller")

__all__ = ["ScriptedWorkerGroup", "build_controller", "dead_worker_error", "in_process_ray",
           "state_name", "step", "user_error"]


# -- worker errors as the controller's poll sees them -----------------------------------------
def user_error(exc: BaseException, traceback_text: str = "") -> BaseException:
    """A worker whose training function raised ``exc``."""
    return UserExceptionWithTraceback(exc, traceback_text)


def dead_worker_error(why: str) -> BaseException:
    """A worker whose process is gone (killed, OOM, its node lost)."""
    return WorkerHealthCheckFailedError(f"worker died: {why}", ActorDiedError())


def startup_timeout(num_workers: int) -> BaseException:
    """What a real group raises when its workers cannot be placed in time."""
    return WorkerGroupStartupTimeoutError(num_workers)


# -- the worker group --------------------------------------------------------------------------
class ScriptedWorkerGroup(WorkerGroup):
    """A worker group whose workers are the ``script``'s (set on a subclass per harness):
    ``script.place(num_workers, selectors)`` -> worker records (``node_id``, ``gpu_ids``,
    ``resources``), ``script.started(workers)``, ``script.poll()`` -> ``{rank: (running,
    error)}``, ``script.replace(rank)`` -> a worker record, ``script.stopped()``. Calls the
    worker-group callbacks where a real group calls them."""

    script: Any = None

    def __init__(self, train_run_context: Any, worker_group_context: Any,
                 callbacks: list[Any] | None = None) -> None:
        self._run_context = train_run_context
        self._context = worker_group_context
        self._hooks = [c for c in callbacks or [] if isinstance(c, WorkerGroupCallback)]
        self._group_state: Any = None
        self._latest: Any = None
        backend = getattr(train_run_context, "backend_config", None)
        self._each_its_own_group = bool(getattr(getattr(backend, "backend_cls", None),
                                            "has_replica_groups", False))

    @classmethod
    def create(cls, train_run_context: Any, worker_group_context: Any,
               callbacks: list[Any] | None = None) -> ScriptedWorkerGroup:
        group = cls(train_run_context, worker_group_context, callbacks)
        group._begin()
        return group

    def _begin(self) -> None:
        for hook in self._hooks:
            hook.before_worker_group_start(self._context)
        num = int(self._context.num_workers)
        records = self.script.place(num, self._context.label_selector)
        workers = [_worker(r, rank, num) for rank, r in enumerate(records)]
        for hook in self._hooks:
            hook.before_init_train_context(workers)
        self._group_state = WorkerGroupState(  # no placement group, no sync actor
            start_time=time_monotonic(), placement_group_handle=None,  # type: ignore[arg-type]
            workers=workers, sync_actor=None)  # type: ignore[arg-type]
        for hook in self._hooks:
            hook.after_worker_group_start(self)
        self.script.started([w.record for w in workers])

    def poll_status(self, timeout: float | None = None) -> Any:
        statuses = {rank: WorkerStatus(running=running, error=error)
                    for rank, (running, error) in self.script.poll().items()}
        mapping = {r: r for r in statuses} if self._each_its_own_group else None
        status = WorkerGroupPollStatus(worker_statuses=statuses,
                                       worker_rank_to_replica_group_rank=mapping)
        self._latest = status
        for hook in self._hooks:
            hook.after_worker_group_poll_status(status)
        return status

    def replace_replica_group(self, replica_group_index: int) -> None:
        record = self.script.replace(replica_group_index)
        workers = self._group_state.workers
        workers[replica_group_index] = _worker(record, replica_group_index, len(workers))

    def shutdown(self) -> None:
        for hook in self._hooks:
            hook.before_worker_group_shutdown(self)
        self.script.stopped()
        self._group_state = None
        for hook in self._hooks:
            hook.after_worker_group_shutdown(self._context)

    def abort(self) -> None:
        self.script.stopped()
        self._group_state = None

    def has_started(self) -> bool:
        return self._group_state is not None

    def get_workers(self) -> list[Any]:
        return list(self._group_state.workers) if self._group_state else []

    def get_worker_group_context(self) -> Any:
        return self._context

    def get_worker_group_state(self) -> Any:
        return self._group_state

    def get_latest_poll_status(self) -> Any:
        return self._latest

    def get_resources_per_worker(self) -> dict[str, float]:
        return dict(self._context.resources_per_worker)

    def __len__(self) -> int:
        return len(self.get_workers())


def _worker(record: Any, rank: int, world: int) -> Any:
    """The worker as callbacks see it (``metadata``, ``resources``, ``distributed_context``),
    holding the script's ``record``."""
    return SimpleNamespace(
        record=record, resources=dict(record.resources),
        metadata=SimpleNamespace(node_id=record.node_id, node_ip=record.node_id,  # one IP a node
                                 gpu_ids=list(record.gpu_ids)),
        distributed_context=DistributedContext(world_rank=rank, world_size=world, local_rank=0,
                                               local_world_size=1, node_rank=0))


# -- the controller -------------------------------------------------------------------------
class _Ref(ObjectRefWrapper):
    """The training function, held as is (no object store)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def get(self) -> Any:
        return self._obj


def build_controller(script: Any, train_run_context: Any, scaling_policy: Any,
                     failure_policy: Any, callbacks: list[Any]) -> Any:
    """Ray's ``TrainController`` over a :class:`ScriptedWorkerGroup` of ``script``, polling
    without delay, without Ray's preemption watcher or its structured logs."""
    group_cls = type("ScriptedGroup", (ScriptedWorkerGroup,), {"script": script})
    controller_cls = type("HarnessController", (TrainController,), {"worker_group_cls": group_cls})
    env = {_constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR: "0",
           _constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR: "0",
           _constants.ENABLE_CONTROLLER_STRUCTURED_LOGGING_ENV_VAR: "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return controller_cls(train_fn_ref=_Ref(lambda: None), train_run_context=train_run_context,
                              scaling_policy=scaling_policy, failure_policy=failure_policy,
                              callbacks=callbacks)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def step(controller: Any, loop: asyncio.AbstractEventLoop) -> None:
    """One iteration of the controller's control loop."""
    loop.run_until_complete(controller._run_control_loop_iteration())


def state_name(controller: Any) -> str:
    """The controller's state, as Ray names it (``RUNNING``, ``ERRORED``, ...)."""
    state = controller.get_state()
    return str(getattr(getattr(state, "_state_type", None), "state_name", type(state).__name__))


def no_reservation_cache(policy: Any) -> None:
    """An elastic policy asks for the cluster's reservations at every decision (Ray caches
    them a second: a scripted cluster changes between two steps)."""
    if hasattr(policy, "GET_RESERVED_RESOURCES_INTERVAL_S"):
        policy.GET_RESERVED_RESOURCES_INTERVAL_S = 0


# -- Ray's cluster-wide calls, answered in process -----------------------------------------
class _Call:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.remote = fn


class _Reservations:
    """Ray Data's autoscaling coordinator as Train's client calls it: every alive node's
    resources are reserved for the run (``reserved()`` -> ``{node: resources}``)."""

    def __init__(self, reserved: Callable[[], Any]) -> None:
        self.request_resources = _Call(lambda **kwargs: None)
        self.cancel_request = _Call(lambda **kwargs: None)
        self.get_reserved_resources = _Call(lambda *args, **kwargs: reserved())


@contextmanager
def in_process_ray(nodes: Callable[[], list[dict[str, Any]]]) -> Iterator[None]:
    """While the block runs: ``ray.get`` returns a value that is not an object ref as it is
    (the in-process coordinator answers at once), ``ray.nodes()`` answers ``nodes()``, and
    the autoscaling coordinator reserves every alive node of it."""

    real_get, real_nodes = ray.get, ray.nodes
    real_factory = _autoscaling.get_or_create_autoscaling_coordinator

    def get(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, ray.ObjectRef):
            return real_get(value, *args, **kwargs)
        if isinstance(value, list) and any(isinstance(v, ray.ObjectRef) for v in value):
            return real_get(value, *args, **kwargs)
        return value

    def reserved() -> Any:  # in the shape this Ray's policy reads
        alive = [n for n in nodes() if n.get("Alive")]
        return reserved_resources([n["Resources"] for n in alive], [n["NodeID"] for n in alive])

    coordinator = _Reservations(reserved)
    ray.get, ray.nodes = get, nodes  # type: ignore[assignment]
    _autoscaling.get_or_create_autoscaling_coordinator = lambda *a, **k: coordinator
    try:
        yield
    finally:
        ray.get, ray.nodes = real_get, real_nodes  # type: ignore[assignment]
        _autoscaling.get_or_create_autoscaling_coordinator = real_factory
