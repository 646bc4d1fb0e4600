"""A RobustTrainer run inside each Tune trial (Train V2 inside Tune): when the trial's loss
diverges or turns NaN, rayguard.tune restarts the trial and the trainer inside resumes from
the last checkpoint taken *before* the anomaly, not from its newest one. One sweep, two
trials: a loop that saves through ``rayguard.train.report(state=)`` and resumes through
``load_state()``, and one written for Ray Train (``ray.train.report(checkpoint=)``, resumed
through ``ray.train.get_checkpoint()``), the way a Transformers loop reports (this was also
``test_frameworks_transformers.py``'s Tune fit)."""

from __future__ import annotations

import json
import os
import time

import ray.cloudpickle as cloudpickle
from ray import tune

import rayguard
import rayguard.tune as rt
from rayguard.testing.recorder import json_checkpoint, report_json

K = 4  # the loss explodes from this step on, on the first run only
NAN_AT, RAY_STEPS = 6, 14  # the Ray Train loop: a NaN loss at step 6, on its first run only


def ray_train_fn(cfg):
    """As Ray's docs write a loop: a checkpoint every 2 steps (0, 2, 4, ...) through
    ``ray.train.report``, resumed from ``ray.train.get_checkpoint()``."""
    import ray.train

    saved = json_checkpoint(ray.train.get_checkpoint())
    start = 0 if saved is None else saved["step"] + 1
    first = not os.path.exists(cfg["marker"])
    for step in range(start, RAY_STEPS):
        loss = 1.0 / (step + 1)
        if first and step >= NAN_AT:
            loss = float("nan")
            open(cfg["marker"], "w").close()  # the anomaly happens on this run only
            time.sleep(1.0)  # slow from there on, so the sweep acts mid-run
        metrics = {"loss": loss, "step": step, "start": start}
        report_json(metrics, {"step": step} if step % 2 == 0 else None)


def trial_fn(config):
    from ray.train import RunConfig, ScalingConfig
    from ray.tune.integration.ray_train import TuneReportCallback

    def train_fn(cfg):
        ctx = rayguard.train.get_context()
        state = rayguard.train.load_state()
        start = 0 if state is None else state["step"] + 1
        first = not os.path.exists(cfg["marker"])
        for step in range(start, 8):
            loss = 1000.0 if (first and step >= K) else 1.0 / (step + 1)
            if first and step >= K:
                open(cfg["marker"], "w").close()  # the anomaly happens on this run only
                time.sleep(1.0)  # diverged steps are slow, so the sweep acts mid-run
            rayguard.train.report({"loss": loss, "step": step, "start": start},
                                  state={"step": step} if ctx.rank == 0 else None)

    ray_loop = config["kind"] == "ray"
    rayguard.RobustTrainer(
        ray_train_fn if ray_loop else train_fn,
        train_loop_config={"marker": os.path.join(config["storage"], f"marker-{config['kind']}")},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=config["storage"], name=f"inner-{config['kind']}",
                             callbacks=[TuneReportCallback()]),
        # the trainer inside leaves the NaN to the sweep's health check (it watches only
        # eval_loss, which the loop never reports), so the NaN reaches Tune
        guard_config=rayguard.GuardConfig(
            numa="off", **({"health": rayguard.HealthConfig(watch_metrics=("eval_loss",))}
                           if ray_loop else {})),
    ).fit()


cloudpickle.register_pickle_by_value(__import__(__name__))


def test_unhealthy_trials_resume_their_trainer_from_the_checkpoint_before_the_anomaly(
        ray_local, tmp_path, groups_left):
    health = rayguard.HealthConfig(stall_timeout_s=120, max_restarts=2)
    sweep = rt.SweepHealthConfig(min_results=3, window=5, divergence_factor=10.0,
                                 throughput_collapse_fraction=None, memory_growth_fraction=None)
    run = rt.run(trial_fn,
                 param_space={"kind": tune.grid_search(["state", "ray"]),
                              "storage": str(tmp_path)},
                 run_config=tune.RunConfig(storage_path=str(tmp_path / "tune")),
                 health=health, sweep_health=sweep)
    grid = run.wait(timeout=600)
    assert not grid.errors
    results = {r.config["kind"]: r for r in grid}
    restarts = {e.trial_id: e for e in run.events(kind="restart")}
    assert len(run.events(kind="restart")) == len(restarts) == 2, run.events()  # one per trial

    # the diverged trial (rayguard state): the checkpoint Tune chose is the last before step K
    state = results["state"].metrics
    chosen = restarts[state["trial_id"]].data["checkpoint_path"]
    assert state["step"] == 7
    # The inner trainer resumed right after the checkpoint Tune chose (before step K).
    assert state["start"] == int(os.path.basename(chosen).split("_")[1]) + 1 <= K

    # the NaN trial (Ray Train checkpoints): the last checkpoint before the NaN is step 4's
    nan = results["ray"].metrics
    chosen = restarts[nan["trial_id"]].data["checkpoint_path"]
    with open(os.path.join(chosen, "state.json")) as f:
        assert json.load(f)["step"] == NAN_AT - 2
    assert nan["step"] == RAY_STEPS - 1 and nan["start"] == NAN_AT - 1
    # the stopped trials' controllers died with their actors: their worker groups' placement
    # groups (the workers' CPUs) are removed too, not held until this driver exits
    assert not groups_left()
