"""rayguard.tune.run on a real local Ray cluster: a 4-trial sweep with NaN, stall and
divergence faults restarts each faulty trial from its last good checkpoint."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle
from ray import tune

import rayguard
import rayguard.tune as rt

_spec = importlib.util.spec_from_file_location(
    "tune_trainables", Path(__file__).with_name("tune_trainables.py"))
trainables = importlib.util.module_from_spec(_spec)
sys.modules["tune_trainables"] = trainables
_spec.loader.exec_module(trainables)
cloudpickle.register_pickle_by_value(trainables)  # trial actors cannot import tests/

FAULT_STEP = 5
STALL_TIMEOUT_S = 3.0


def _health(**kw) -> rayguard.HealthConfig:
    return rayguard.HealthConfig(**{"stall_timeout_s": STALL_TIMEOUT_S, "max_restarts": 2, **kw})


SWEEP = rt.SweepHealthConfig(min_results=3, window=5, divergence_factor=10.0,
                             throughput_collapse_fraction=None, memory_growth_fraction=None)


@pytest.mark.compat  # also run on the oldest supported Ray
def test_four_trial_sweep_restarts_faulty_trials(ray_local, tmp_path):
    marker = tmp_path / "markers"
    marker.mkdir()
    kinds = ["nan", "stall", "diverge", "healthy"]
    run = rt.run(
        tune.with_resources(trainables.faulty, {"cpu": 0.5}),
        param_space={"kind": tune.grid_search(kinds), "marker_dir": str(marker),
                     "fault_step": FAULT_STEP, "steps": 12},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), name="sweep",
                                  verbose=0),
        health=_health(), sweep_health=SWEEP)
    assert not run.done()  # returned before any trial could end
    assert all(s.state not in ("TERMINATED", "ERROR") for s in run.status().values())

    grid = run.wait(timeout=240)
    assert not grid.errors
    status = run.status()
    by_kind = {r.config["kind"]: r for r in grid}
    ids = {kind: r.metrics["trial_id"] for kind, r in by_kind.items()}
    for kind, r in by_kind.items():
        assert r.metrics["step"] == 12, kind
        assert math.isfinite(r.metrics["loss"]), kind

    restarts = {e.trial_id: e for e in run.events(kind="restart")}
    # NaN at step k: restarted from the checkpoint of step k-1, then completed.
    assert restarts[ids["nan"]].data["check"] == "nonfinite"
    assert restarts[ids["nan"]].data["checkpoint_iteration"] == FAULT_STEP - 1
    assert by_kind["nan"].metrics["resumed_from"] == FAULT_STEP - 1
    # Divergence at step k: same.
    assert restarts[ids["diverge"]].data["check"] == "divergence"
    assert by_kind["diverge"].metrics["resumed_from"] == FAULT_STEP - 1
    # Stall after step k-1: detected (within the timeout + a loop turn), restarted.
    stall = run.events(kind="unhealthy", trial_id=ids["stall"])[0]
    assert stall.data["verdict"]["check"] == "stall"
    assert stall.data["verdict"]["value"] > STALL_TIMEOUT_S  # detected, not a wall-time bound
    assert by_kind["stall"].metrics["resumed_from"] == FAULT_STEP - 1
    # Healthy trial undisturbed.
    assert status[ids["healthy"]].restarts == 0
    assert not run.events(trial_id=ids["healthy"], kind="unhealthy")
    assert by_kind["healthy"].metrics["resumed_from"] == -1
    for kind in ("nan", "stall", "diverge"):
        assert status[ids[kind]].restarts == 1, kind
    # The events also went to the experiment directory.
    assert [e.kind for e in rt.read(run.experiment_path)] == [e.kind for e in run.events()]
