"""A RobustTrainer run inside each Tune trial (Train V2 inside Tune): when the trial's loss
diverges, rayguard.tune restarts the trial and the trainer inside resumes from the last
checkpoint taken *before* the anomaly, not from its newest one."""

from __future__ import annotations

import os
import time

import ray.cloudpickle as cloudpickle
from ray import tune

import rayguard
import rayguard.tune as rt

K = 4  # the loss explodes from this step on, on the first run only


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

    rayguard.RobustTrainer(
        train_fn, train_loop_config={"marker": config["marker"]},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=config["storage"], name="inner",
                             callbacks=[TuneReportCallback()]),
        guard_config=rayguard.GuardConfig(numa="off"),
    ).fit()


cloudpickle.register_pickle_by_value(__import__(__name__))


def test_diverged_trial_resumes_inner_trainer_from_checkpoint_before_anomaly(ray_local, tmp_path,
                                                                            groups_left):
    health = rayguard.HealthConfig(stall_timeout_s=120, max_restarts=2)
    sweep = rt.SweepHealthConfig(min_results=3, window=5, divergence_factor=10.0,
                                 throughput_collapse_fraction=None, memory_growth_fraction=None)
    run = rt.run(trial_fn,
                 param_space={"marker": str(tmp_path / "marker"), "storage": str(tmp_path)},
                 run_config=tune.RunConfig(storage_path=str(tmp_path / "tune")),
                 health=health, sweep_health=sweep)
    grid = run.wait(timeout=600)
    assert not grid.errors
    restarts = run.events(kind="restart")
    assert len(restarts) == 1
    chosen = restarts[0].data["checkpoint_path"]
    final = grid[0].metrics
    assert final["step"] == 7
    # The inner trainer resumed right after the checkpoint Tune chose (before step K).
    assert final["start"] == int(os.path.basename(chosen).split("_")[1]) + 1 <= K
    # the stopped trial's controller died with its actor: its worker group's placement group
    # (the worker's CPU) is removed too, not held until this driver exits
    assert not groups_left()
