"""Ray Train's ``PlacementGroupCleaner`` where it cannot work: left out.

Ray Train starts a detached ``PlacementGroupCleaner`` actor with every run; its thread asks
Ray's State API every few seconds whether the controller is still alive, to remove the run's
placement group if the controller died without doing so. The State API is served by the
dashboard: on a cluster started without it (``ray.init(include_dashboard=False)``, as
rayguard's examples and tests start theirs, or a ``pip install ray`` with no
``ray[default]``), every question fails and the cleaner logs
``Failed to query Ray Train Controller actor state...`` to the driver's console, a few times
in a healthy run and dozens in a run with a fault, while it can never clean anything up.

:func:`without_blind_cleaner` drops Ray's ``PlacementGroupCleanerCallback`` from a run's
controller callbacks when one State API question fails at ``fit()`` (about 15 ms); with the
dashboard up the cleaner is kept as Ray starts it.

Where the cleaner is left out and the run's controller can die without ending the run (a
``fit()`` in a Tune trial: when Tune stops the trial, to restart it or as a scheduler's early
stop, the trial's actor goes and the controller with it), :class:`GroupReleaser` takes its
place: a placement group lives until its creator *and* its job have ended, so the stopped
trial's workers' CPUs (and GPUs) stayed reserved until the sweep's driver exited. The releaser
asks the GCS (not the State API) whether the controller is alive, from a detached actor with
no CPU, and removes the run's groups once it is not; a run that ends as runs do stops it.

Relies on ``ray.train.v2._internal.callbacks.placement_group_callback
.PlacementGroupCleanerCallback`` (Ray 2.59 and 2.60), Ray Train's controller and worker-group
callback classes and ``ray._private.state.actors``; without the first the callbacks are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rayguard")

_NO_SUCH_ACTOR = "ffffffffffffffffffffffff01000000"


def state_api_answers(timeout_s: int = 2) -> bool:
    """Whether Ray's State API answers (the dashboard serves it) on the connected cluster."""
    try:
        from ray.util.state import get_actor

        get_actor(_NO_SUCH_ACTOR, timeout=timeout_s)
    except Exception as exc:  # ServerUnavailable, RayStateApiException, a timeout
        logger.debug("rayguard: Ray's State API does not answer: %s", exc)
        return False
    return True


def without_blind_cleaner(callbacks: list[Any],
                          answers: Callable[[], bool] = state_api_answers, *,
                          owner_may_vanish: bool | None = None) -> list[Any]:
    """``callbacks`` without Ray's ``PlacementGroupCleanerCallback`` when the State API it
    polls does not answer (``answers()`` False), with a :class:`GroupReleaser` in its place
    where ``owner_may_vanish`` (by default: this is not the process's main thread, as in a
    Tune trial, where ``fit()`` runs); unchanged otherwise."""
    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import (
            PlacementGroupCleanerCallback,
        )
    except ImportError:
        return callbacks
    if not any(isinstance(c, PlacementGroupCleanerCallback) for c in callbacks) or answers():
        return callbacks
    logger.debug("rayguard: Ray's State API does not answer (no dashboard): Ray Train's "
                 "placement-group cleaner is not started (it could only warn)")
    kept = [c for c in callbacks if not isinstance(c, PlacementGroupCleanerCallback)]
    if owner_may_vanish is None:
        import threading

        owner_may_vanish = threading.current_thread() is not threading.main_thread()
    return kept + [GroupReleaser()] if owner_may_vanish else kept


def controller_alive(actor_id: str) -> bool:
    """Whether the GCS holds actor ``actor_id`` as not dead (an unknown one: dead)."""
    from ray._private.state import actors

    info = actors(actor_id=actor_id)
    return bool(info) and info.get("State") != "DEAD"


class _Releaser:
    """A detached actor: removes the registered placement groups once the controller
    ``controller_id`` is dead (asked every ``interval_s``), then exits."""

    def __init__(self, controller_id: str, interval_s: float) -> None:
        import threading

        self._controller_id, self._interval_s = controller_id, interval_s
        self._groups: list[Any] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="rayguard-group-releaser", daemon=True).start()

    def register(self, group: Any) -> None:
        with self._lock:
            self._groups.append(group)

    def _watch(self) -> None:
        import time

        import ray
        from ray.util.placement_group import remove_placement_group

        while True:
            time.sleep(self._interval_s)
            try:
                if controller_alive(self._controller_id):
                    continue
            except Exception as exc:  # the GCS unreachable for a moment: ask again
                logger.debug("rayguard: could not ask whether the controller lives: %s", exc)
                continue
            with self._lock:
                groups = list(self._groups)
            for group in groups:
                try:
                    remove_placement_group(group)  # an already removed one: a no-op
                except Exception as exc:
                    logger.warning("rayguard: could not remove placement group %s of a "
                                   "controller that died: %s", group.id.hex(), exc)
            try:
                ray.actor.exit_actor()  # as Ray Train's own cleaner ends, from its thread
            except Exception as exc:
                logger.debug("rayguard: the placement-group releaser's exit: %s", exc)
            return


def _callback_bases() -> tuple[type, ...]:
    try:
        from ray.train.v2._internal.execution.callback import (
            ControllerCallback,
            WorkerGroupCallback,
        )
    except ImportError:
        return (object,)
    return (ControllerCallback, WorkerGroupCallback)


class GroupReleaser(*_callback_bases()):  # type: ignore[misc]
    """Controller callback: starts the run's :class:`_Releaser` when the controller starts,
    registers each worker group's placement group with it, stops it when the run ends (a
    run that ends removes its own groups)."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self._interval_s = interval_s
        self._releaser: Any = None

    def after_controller_start(self, train_run_context: Any) -> None:
        import ray

        try:
            self._releaser = ray.remote(num_cpus=0)(_Releaser).options(
                lifetime="detached", scheduling_strategy="DEFAULT",
            ).remote(ray.get_runtime_context().get_actor_id(), self._interval_s)
        except Exception as exc:
            logger.warning("rayguard: the placement-group releaser did not start (%s): if "
                           "this run's trial is stopped, its workers' resources stay "
                           "reserved until the sweep's driver exits", exc)

    def after_worker_group_start(self, worker_group: Any) -> None:
        if self._releaser is None:
            return
        group = worker_group.get_worker_group_state().placement_group_handle.placement_group
        self._releaser.register.remote(group)

    async def before_controller_shutdown(self) -> None:
        self._stop()

    def before_controller_abort(self) -> None:
        self._stop()

    def _stop(self) -> None:
        import ray

        if self._releaser is not None:
            ray.kill(self._releaser)
            self._releaser = None


__all__ = ["GroupReleaser", "controller_alive", "state_api_answers", "without_blind_cleaner"]
