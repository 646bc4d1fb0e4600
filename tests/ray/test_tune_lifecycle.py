"""rayguard.tune on a real local Ray cluster: restart budget, plain Tuner use of the
HealthCallback with a scheduler, stop() mid-sweep (no actors left) and resume."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import ray.cloudpickle as cloudpickle
from ray import tune
from ray.tune.schedulers import ASHAScheduler

import rayguard
import rayguard.tune as rt

_spec = importlib.util.spec_from_file_location(
    "tune_trainables", Path(__file__).with_name("tune_trainables.py"))
trainables = importlib.util.module_from_spec(_spec)
sys.modules["tune_trainables"] = trainables
_spec.loader.exec_module(trainables)
cloudpickle.register_pickle_by_value(trainables)  # trial actors cannot import tests/


def _health(**kw) -> rayguard.HealthConfig:
    return rayguard.HealthConfig(**{"stall_timeout_s": 30.0, **kw})


SWEEP = rt.SweepHealthConfig(min_results=3, window=5, throughput_collapse_fraction=None,
                             memory_growth_fraction=None)


def _alive_trial_actors() -> list:
    """Trial actors still alive, from the GCS actor table (``ray.util.state.list_actors``
    needs the dashboard, which the shared test cluster does not start)."""
    import ray._private.state as state

    return [a for a in state.actors().values()
            if a["State"] == "ALIVE" and a["ActorClassName"] == "ImplicitFunc"]


def test_restart_budget_exhausted_with_plain_tuner(ray_local, tmp_path):
    """A trial that NaNs at every attempt is restarted max_restarts times, then ends as
    errored with the reason; a healthy neighbour under ASHA completes."""
    callback = rt.HealthCallback(_health(max_restarts=1), sweep_health=SWEEP)
    tuner = tune.Tuner(
        tune.with_resources(trainables.faulty, {"cpu": 0.5}),
        param_space={"kind": tune.grid_search(["nan", "healthy"]), "always": True,
                     "fault_step": 3, "steps": 6, "marker_dir": str(tmp_path)},
        tune_config=tune.TuneConfig(metric="step", mode="max", scheduler=ASHAScheduler(
            time_attr="training_iteration", max_t=100, grace_period=50)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="budget", verbose=0,
                                  callbacks=[callback]))
    grid = tuner.fit()
    by_kind = {r.config["kind"]: r for r in grid}
    assert by_kind["healthy"].error is None and by_kind["healthy"].metrics["step"] == 6
    error = by_kind["nan"].error
    assert error is not None
    assert "max_restarts=1" in str(error) and "nonfinite" in str(error), str(error)
    nan_id = by_kind["nan"].metrics["trial_id"]
    kinds = [e.kind for e in callback.event_log.events(trial_id=nan_id)]
    assert kinds.count("restart") == 1 and kinds.count("failed") == 1, kinds
    restart = callback.event_log.events(kind="restart", trial_id=nan_id)[0]
    assert restart.data["checkpoint_iteration"] == 2
    assert callback.status()[nan_id].state == "ERROR"


def test_stop_mid_sweep_leaves_no_actors_then_resume(ray_local, tmp_path):
    param_space = {"kind": "healthy", "steps": 12, "step_s": 0.3,
                   "x": tune.grid_search([1, 2])}
    trainable = tune.with_resources(trainables.faulty, {"cpu": 0.5})
    run = rt.run(trainable, param_space=param_space,
                 run_config=tune.RunConfig(storage_path=str(tmp_path), name="stopme",
                                           verbose=0),
                 health=_health(), sweep_health=SWEEP)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = run.status()
        ckpts = [s.checkpoint_iteration or 0 for s in status.values()]
        if len(status) == 2 and min(ckpts) >= 2:
            break
        assert not run.done()
        time.sleep(0.2)
    else:
        raise AssertionError(f"trials never checkpointed: {run.status()}")
    grid = run.stop(timeout=60)
    assert run.done() and len(grid) == 2
    assert not _alive_trial_actors()
    stopped_at = {r.metrics["trial_id"]: r.metrics["step"] for r in grid}
    assert all(step < 12 for step in stopped_at.values()), stopped_at
    assert run.events(kind="stop_requested")[0].data["resumable"] is True

    resumed = rt.run(trainable, param_space=param_space, restore=run.experiment_path,
                     health=_health(), sweep_health=SWEEP)
    grid = resumed.wait(timeout=120)
    assert not grid.errors
    for r in grid:
        assert r.metrics["step"] == 12
        assert r.metrics["resumed_from"] >= 2  # continued from its checkpoint
    assert not _alive_trial_actors()
