"""The torch backend of live recovery (``GuardConfig(recovery="live")``).

Ray Train's controller replaces a failed worker alone, on the placement group it already
holds, when the backend says it runs *replica groups* (``Backend.has_replica_groups``, the
path Ray 2.59+ takes for ``TorchftConfig``): the others keep their processes. This backend
makes every worker its own replica group in Ray's eyes while the workers still form one
``torch.distributed`` process group:

* when the whole worker group starts, it is Ray's own ``TorchConfig`` set-up (one process
  group over every worker: ``backend``, ``init_method``, ``timeout_s`` as the user gave);
* when Ray starts a replacement (a ``ReplicaGroup`` of one worker), only the environment
  is set: the replacement and the survivors then form the process group again through the
  run's coordinator (:mod:`rayguard.train.live`).

Whether Ray replaces the failed workers alone is not left to Ray: its controller does so
whenever some replica group has not failed, so rayguard's controller callback
(:class:`rayguard.controller.callbacks.RayGuardCallback`) applies
:func:`rayguard.health.live.plan_recovery_path` at each poll and, where the plan is a
whole-group restart (a live attempt that failed, a lost node), marks every worker failed.

Relies on (Ray 2.59 and 2.60): ``ray.train.backend.Backend.has_replica_groups``, the
controller's ``_replace_bad_workers`` path, ``ray.train.torch.config._TorchBackend`` and
``_set_torch_distributed_env_vars``, and
``ray.train.v2._internal.execution.worker_group.execution_group.ReplicaGroup``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

from rayguard.constants import LIVE_PG_ENV_VAR

logger = logging.getLogger("rayguard")

_replica_group: Any
try:
    from ray.train.v2._internal.execution.worker_group.execution_group import (
        ReplicaGroup as _replica_group,
    )
except ImportError:  # pragma: no cover - a Ray without replica groups: live mode is refused
    _replica_group = None


def live_supported() -> bool:
    """Whether this Ray replaces a failed replica group alone."""
    from ray.train.backend import Backend

    return _replica_group is not None and hasattr(Backend, "has_replica_groups")


def _backend_name(worker_group: Any, config: TorchConfig) -> str:
    if config.backend:
        return str(config.backend)
    gpus = worker_group.get_resources_per_worker().get("GPU", 0)
    return "nccl" if gpus > 0 else "gloo"


def _set_pg_env(value: str) -> None:
    os.environ[LIVE_PG_ENV_VAR] = value


class _LiveTorchBackend(_TorchBackend):
    """Ray's torch backend, with each worker a replica group Ray can replace alone."""

    has_replica_groups: bool = True

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        worker_group.execute(_set_pg_env, f"{_backend_name(worker_group, backend_config)},"
                                          f"{int(backend_config.timeout_s)}")
        if _replica_group is not None and isinstance(worker_group, _replica_group):
            worker_group.execute(_set_torch_distributed_env_vars)  # the group: rayguard's
            return
        super().on_start(worker_group, backend_config)


class LiveTorchConfig(TorchConfig):
    """The user's ``TorchConfig`` (same ``backend``, ``init_method``, ``timeout_s``), run by
    :class:`_LiveTorchBackend`."""

    @property
    def backend_cls(self) -> type[_LiveTorchBackend]:
        return _LiveTorchBackend


def live_config(config: TorchConfig) -> LiveTorchConfig:
    """``config`` as a :class:`LiveTorchConfig`."""
    return LiveTorchConfig(backend=config.backend, init_method=config.init_method,
                           timeout_s=config.timeout_s)


def apply_live(guard: Any, kwargs: dict[str, Any]) -> bool:
    """``GuardConfig(recovery="live")``: whether a failed worker can be
    replaced alone (a fixed-size group of 2 or more on Ray's own ``TorchConfig``); if so, ``kwargs``'
    ``torch_config`` becomes its live form (:mod:`rayguard._ray.live_backend`). Elsewhere
    only NaN/inf rolls back in place and a lost worker restarts the group, as it is said."""
    if guard.recovery != "live":
        return False
    config = kwargs.get("torch_config")
    scaling = kwargs.get("scaling_config")
    workers = getattr(scaling, "num_workers", 1)
    why = None
    if config is not None and type(config) is not TorchConfig:
        why = f"torch_config is a {type(config).__name__}, whose backend places the workers"
    elif isinstance(workers, int) and workers < 2:
        why = (f"ScalingConfig(num_workers={workers!r}): live replacement needs 2 or more "
               "workers")
    elif not isinstance(workers, int) and max(workers) < 2:
        why = f"ScalingConfig(num_workers={workers!r}): never more than one worker"
    elif not live_supported():
        why = "this Ray cannot replace one worker alone"
    if why is not None:
        logger.info("rayguard: GuardConfig(recovery='live'): a lost worker restarts the worker "
                    "group (%s); NaN/inf still rolls back in place", why)
        return False
    kwargs["torch_config"] = live_config(config or TorchConfig())
    return True


__all__ = ["LiveTorchConfig", "apply_live", "live_config", "live_supported"]
