"""Ray Tune internals: applies health decisions to a running Tune experiment, and the few
private Tune/Train objects ``rayguard.tune`` builds (the only module that touches them).

Ray Tune has no public API to restart a trial from a chosen checkpoint, so this module uses
the internals of ``TuneController`` (Ray 2.59 and 2.60 alike) the same way Tune's own failure
recovery (``TuneController._try_recover``) does:

* ``TuneController._trial_to_actor``, ``_actor_manager.remove_actor(kill=True)``,
  ``_actor_manager.is_actor_started``: end the trial's actor at once (a stalled one too);
* ``TuneController._schedule_trial_stop(trial, exception=...)``,
  ``_requeue_trial(trial)``, ``_cached_trial_decisions``, ``_queued_trial_decisions``:
  stop the trial and put it back in the queue as PENDING;
* ``trial.run_metadata.checkpoint_manager._latest_checkpoint_result`` and
  ``._checkpoint_results``: the checkpoint Tune restores the requeued trial from;
* ``_scheduler_alg``, ``_search_alg``, ``_callbacks``, ``_iteration``, ``_trials``:
  to end a trial as errored the way ``_process_trial_failure`` does;
* the controller itself is found by walking up the callback's call stack, and
  ``TuneRun.stop()`` sets ``ray.tune.tune.run``'s local ``experiment_interrupted_event``
  (what its Ctrl+C handler sets) found the same way;
* ``ray.train._internal.session._TrainingResult(checkpoint=, metrics=)``: what Tune's
  checkpoint manager restores from (:func:`training_result`);
* ``ray.train._internal.storage.StorageContext(...).experiment_fs_path``: where a sweep
  stores its results (:func:`experiment_path`);
* ``Tuner._local_tuner.get_run_config()``: the run config a (restored) ``Tuner`` will use
  (:func:`stored_run_config`).

Every access is guarded: a Ray version without them raises :class:`TuneInternalsError`
(a :class:`~rayguard.exceptions.RayVersionError`) naming the missing attribute instead of
failing somewhere inside Tune.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayguard._ray import version_error
from rayguard.exceptions import HealthError, RayVersionError

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from rayguard.health.decisions import CheckpointRecord

CONTROLLER_ATTRS = (
    "_trial_to_actor", "_actor_manager", "_schedule_trial_stop", "_requeue_trial",
    "_cached_trial_decisions", "_queued_trial_decisions", "_scheduler_alg", "_search_alg",
    "_callbacks", "_trials", "request_stop_experiment",
)


class TuneInternalsError(RayVersionError, HealthError):
    """The installed Ray Tune lacks an internal rayguard.tune relies on."""


class HealthRestart(HealthError):
    """Why a trial was stopped and requeued by a health check (recorded in its error file
    only when the restart budget is spent)."""


def _missing(obj: object, names: tuple[str, ...], what: str) -> None:
    absent = [n for n in names if not hasattr(obj, n)]
    if absent:
        raise _tune_error(", ".join(f"{what}.{n}" for n in absent))


def _tune_error(thing: str) -> TuneInternalsError:
    return TuneInternalsError(str(version_error(thing, "rayguard.tune's health restarts")))


def training_result(path: str, metrics: dict[str, Any]) -> Any:
    """What Tune's checkpoint manager restores a trial from, for the checkpoint at ``path``."""
    try:
        from ray.train._internal.session import _TrainingResult
    except ImportError as exc:
        raise _tune_error("ray.train._internal.session._TrainingResult") from exc
    from ray.tune import Checkpoint

    return _TrainingResult(checkpoint=Checkpoint(path), metrics=metrics)


def experiment_path(run_config: Any) -> str:
    """The directory a sweep with ``run_config`` stores its results in (as Tune computes it)."""
    try:
        from ray.train._internal.storage import StorageContext
    except ImportError as exc:
        raise _tune_error("ray.train._internal.storage.StorageContext") from exc
    storage = StorageContext(storage_path=run_config.storage_path,
                             experiment_dir_name=run_config.name,
                             storage_filesystem=run_config.storage_filesystem)
    return storage.experiment_fs_path


def stored_run_config(tuner: Any) -> Any:
    """The ``RunConfig`` object ``tuner.fit()`` will use (for a restored tuner, the one
    unpickled from the experiment); changes to it apply to the run."""
    local = getattr(tuner, "_local_tuner", None)
    _missing(local, ("get_run_config",), "Tuner._local_tuner")
    return local.get_run_config()  # type: ignore[union-attr]


def find_controller(max_depth: int = 10) -> Any:
    """The ``TuneController`` that is calling the current callback hook."""
    from ray.tune.execution.tune_controller import TuneController

    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, TuneController):
            _missing(candidate, CONTROLLER_ATTRS, "TuneController")
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    raise TuneInternalsError(
        "HealthCallback could not find the Ray Tune controller calling it. Use it as a "
        "callback of a Tuner (RunConfig(callbacks=[...])) or through rayguard.tune.run")


def experiment_dir(controller: Any) -> str | None:
    """The experiment's driver-side directory, where the sweep event file goes."""
    storage = getattr(controller, "_storage", None)
    return getattr(storage, "experiment_driver_staging_path", None)


def publish_event_file(controller: Any, local_file: Path | None) -> None:
    """Copy the sweep event file from the driver's staging directory to the experiment's
    storage directory. Tune syncs the staging directory for the last time before it calls
    ``on_experiment_end``, so without this copy the stored file lacks ``sweep_finished``."""
    storage = getattr(controller, "_storage", None)
    dest_dir = getattr(storage, "experiment_fs_path", None)
    if storage is None or local_file is None or dest_dir is None or not local_file.exists():
        return
    import pyarrow.fs

    fs = storage.storage_filesystem
    dest = f"{dest_dir}/{local_file.name}"
    if isinstance(fs, pyarrow.fs.LocalFileSystem) and Path(dest).resolve() == local_file.resolve():
        return
    fs.create_dir(dest_dir, recursive=True)
    pyarrow.fs.copy_files(str(local_file), dest, source_filesystem=pyarrow.fs.LocalFileSystem(),
                          destination_filesystem=fs)


def _end_actor(controller: Any, trial: Trial, exception: Exception) -> None:
    """Stop the trial (status ERROR) and kill its actor now, stalled or not."""
    controller._cached_trial_decisions.pop(trial.trial_id, None)
    controller._queued_trial_decisions.pop(trial.trial_id, None)
    trial.temporary_state.saving_to = None
    tracked = controller._trial_to_actor.get(trial)
    controller._schedule_trial_stop(trial, exception=exception)
    manager = controller._actor_manager
    if tracked is not None and manager.is_actor_started(tracked):
        # _schedule_trial_stop asked the actor to stop after its current task; a stalled
        # task never ends, so kill it (processed first thing in the next event loop turn).
        manager.remove_actor(tracked, kill=True)


def set_restore_point(trial: Trial, checkpoint: CheckpointRecord | None) -> None:
    """Make Tune restore ``trial`` from ``checkpoint`` (``None``: from scratch)."""
    manager: Any = trial.run_metadata.checkpoint_manager
    _missing(manager, ("_latest_checkpoint_result", "_checkpoint_results"),
             "_CheckpointManager")
    upto = checkpoint.iteration if checkpoint else 0
    manager._checkpoint_results = [
        r for r in manager._checkpoint_results
        if (r.metrics or {}).get("training_iteration", 0) <= upto]
    manager._latest_checkpoint_result = checkpoint.source if checkpoint else None
    trial.invalidate_json_state()
    trial.run_metadata.invalidate_cache()


def restart_trial(controller: Any, trial: Trial, checkpoint: CheckpointRecord | None,
                  reason: str) -> None:
    """End the trial's actor and requeue the trial (PENDING) to restore ``checkpoint``."""
    _end_actor(controller, trial, HealthRestart(reason))
    set_restore_point(trial, checkpoint)
    controller._requeue_trial(trial)


def fail_trial(controller: Any, trial: Trial, reason: str,
               error: HealthError | None = None) -> None:
    """End the trial as errored with ``error`` (default: a HealthError saying ``reason``),
    as Tune ends a trial out of retries."""
    error = error if error is not None else HealthError(reason)
    trial.handle_error(error)  # type: ignore[arg-type]
    controller._has_errored = True
    controller._scheduler_alg.on_trial_error(controller, trial)
    controller._search_alg.on_trial_complete(trial.trial_id, error=True)
    _end_actor(controller, trial, error)
    controller._callbacks.on_trial_error(iteration=getattr(controller, "_iteration", 0),
                                         trials=controller._trials, trial=trial)


INTERRUPT_EVENT = "experiment_interrupted_event"


def interrupt_experiment(controller: Any, max_depth: int = 12) -> bool:
    """End the sweep the way Ctrl+C does: ``tune.run`` leaves its loop, saves the
    experiment state with the unfinished trials still unfinished (so ``Tuner.restore``
    resumes them from their checkpoints), then stops every trial actor.

    Sets the ``threading.Event`` local of ``ray.tune.tune.run`` that its SIGINT handler
    sets (that handler is only installed in the main thread). Falls back to
    ``TuneController.request_stop_experiment`` (trials end TERMINATED, not resumable) and
    returns False when the event is not found.
    """
    import threading

    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            break
        event = frame.f_locals.get(INTERRUPT_EVENT)
        if isinstance(event, threading.Event) and frame.f_code.co_name == "run":
            event.set()
            return True
        frame = frame.f_back  # type: ignore[assignment]
    controller.request_stop_experiment()
    return False
