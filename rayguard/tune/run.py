"""``rayguard.tune.run``: start a Tune sweep with health checks and return at once."""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any

from rayguard._ray.tune import experiment_path, stored_run_config
from rayguard.constants import DEFAULT_SERIALIZERS, SERIALIZERS_ENV_VAR, env_str
from rayguard.exceptions import config_error
from rayguard.health.config import HealthConfig
from rayguard.health.sweep_config import SweepHealthConfig, resolve_sweep_health
from rayguard.tune.callback import HealthCallback
from rayguard.tune.handle import TuneRun


def _register_serializers() -> threading.Thread | None:
    """rayguard's tensor serializers in the driver (unless ``RAYGUARD_SERIALIZERS=0``).

    Registering imports torch, which takes seconds in a driver that has not imported it
    yet; such a driver holds no tensor to send, so the import and the registration run in
    a daemon thread and ``run()`` still returns at once. Until that thread is done, a
    tensor the driver sends goes through torch's own pickling (correct, only slower).
    Returns that thread, or None when the registration was done (or skipped) here."""
    if env_str(SERIALIZERS_ENV_VAR, DEFAULT_SERIALIZERS) == "0":
        return None
    from rayguard.serialization import register_tensor_serializers

    if "torch" in sys.modules:
        register_tensor_serializers()
        return None
    thread = threading.Thread(target=register_tensor_serializers,
                              name="rayguard-register-serializers", daemon=True)
    thread.start()
    return thread


def _with_callback(callbacks: list[Any] | None, callback: HealthCallback) -> list[Any]:
    """``callbacks`` with ``callback`` in place of any HealthCallback (same position, so a
    resumed sweep hands it the saved state), or appended."""
    out = list(callbacks or [])
    for i, existing in enumerate(out):
        if isinstance(existing, HealthCallback):
            out[i] = callback
            return out
    return [*out, callback]


def run(trainable: Any, *, param_space: dict[str, Any] | None = None,
        tune_config: Any = None, run_config: Any = None,
        health: HealthConfig | None = None, sweep_health: SweepHealthConfig | None = None,
        restore: str | None = None, resume_errored: bool = True) -> TuneRun:
    """Start a sweep (``Tuner(...).fit()``) in the background and return its handle.

    Args:
        trainable: what ``ray.tune.Tuner`` accepts (a function, a Trainable class, ...).
        param_space, tune_config, run_config: as for ``ray.tune.Tuner``. ``run_config``
            gets the health callback appended to its callbacks (the caller's is not changed).
        health: the checks and restart budget; ``None`` means ``HealthConfig()``.
        sweep_health: the series checks (divergence, throughput collapse, memory growth);
            ``None`` means ``SweepHealthConfig()``.
        restore: an experiment directory to resume (``TuneRun.experiment_path`` of an
            earlier run); the stored run and tune configs are used, as ``Tuner.restore``
            does, and ``run_config``/``tune_config`` must be left out.
        resume_errored: when restoring, resume errored trials from their checkpoints.
    """
    from ray import tune

    health = health if health is not None else HealthConfig()
    if not isinstance(health, HealthConfig):
        raise config_error("rayguard.tune.run", "health", health, "must be a HealthConfig",
                           "pass health=rayguard.HealthConfig(...)")
    sweep_health = resolve_sweep_health(sweep_health, "rayguard.tune.run")
    _register_serializers()
    callback = HealthCallback(health, sweep_health=sweep_health)
    if restore is not None:
        if run_config is not None or tune_config is not None:
            raise config_error("rayguard.tune.run", "run_config/tune_config",
                               "given with restore", "a resumed sweep keeps its stored configs",
                               "leave run_config and tune_config out when passing restore=")
        tuner = tune.Tuner.restore(restore, trainable, resume_errored=resume_errored,
                                   param_space=param_space)
        stored = stored_run_config(tuner)  # the unpickled RunConfig
        stored.callbacks = _with_callback(stored.callbacks, callback)
    else:
        run_config = copy.copy(run_config) if run_config is not None else tune.RunConfig()
        run_config.callbacks = _with_callback(run_config.callbacks, callback)
        tuner = tune.Tuner(trainable, param_space=param_space, tune_config=tune_config,
                           run_config=run_config)
        stored = stored_run_config(tuner)
    return TuneRun(tuner, callback, experiment_path(stored))
