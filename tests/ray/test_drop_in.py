"""Drop-in means drop-in: the same Ray Train loop (ray.train.report with its own
checkpoints, ray.train.get_checkpoint after a failure, CheckpointConfig, FailureConfig,
TorchConfig, the Ray Train context) gives the same Result through TorchTrainer and
RobustTrainer."""

from __future__ import annotations

import os

import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

import rayguard
from rayguard.testing.recorder import json_checkpoint, report_json

LOSSES = [4.0, 2.0, 3.0, 1.0, 5.0]


def ray_train_loop(config):
    import torch.distributed as dist

    ctx = ray.train.get_context()
    assert dist.is_initialized() and dist.get_world_size() == ctx.get_world_size() == 2
    saved = json_checkpoint(ray.train.get_checkpoint())
    start = 0 if saved is None else saved["step"] + 1
    resumed_from = start - 1
    marker = os.path.join(config["marker_dir"], "failed")
    for step in range(start, len(LOSSES)):
        if step == 3 and not os.path.exists(marker):
            # Both ranks have handed over their step-2 reports before rank 1 fails: which
            # reports the controller saw first is then not a race of poll intervals (Ray
            # polls every 2 s, RobustTrainer every 50 ms).
            dist.barrier()
            if ctx.get_world_rank() == 1:
                open(marker, "w").close()
                raise RuntimeError("transient failure at step 3")
        metrics = {"loss": LOSSES[step], "step": step, "resumed_from": resumed_from}
        report_json(metrics, {"step": step} if ctx.get_world_rank() == 0 else None)


def _summary(result):
    def step_of(ckpt):
        return json_checkpoint(ckpt)["step"]

    return {
        "error": result.error,
        "metrics": {k: result.metrics[k] for k in ("loss", "step", "resumed_from")},
        "checkpoint_step": step_of(result.checkpoint),
        "best": sorted((m["loss"], step_of(c)) for c, m in result.best_checkpoints),
    }


def _fit(cls, tmp_path, name, **extra):
    marker_dir = tmp_path / f"markers-{name}"
    marker_dir.mkdir()
    trainer = cls(
        ray_train_loop, train_loop_config={"marker_dir": str(marker_dir)},
        scaling_config=ScalingConfig(num_workers=2),
        torch_config=TorchConfig(backend="gloo", timeout_s=300),
        run_config=RunConfig(
            storage_path=str(tmp_path), name=name,
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                               checkpoint_score_order="min")),
        **extra)
    return _summary(trainer.fit())


def test_a_ray_train_loop_gives_the_same_result_through_both_trainers(ray_local, tmp_path,
                                                                    monkeypatch):
    # Ray's controller polls its workers every 2 s by default; the plain run polls as often
    # as rayguard's does (8-10 s less of this test), which sets its own for the second run
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.05")
    plain = _fit(TorchTrainer, tmp_path, "torch")
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    guarded = _fit(rayguard.RobustTrainer, tmp_path, "robust",
                   guard_config=rayguard.GuardConfig(numa="off", seed=None))
    # The failure at step 3 was retried (FailureConfig(max_failures=1)), the loop resumed
    # from Ray's own checkpoint of step 2, and Ray kept the two best checkpoints.
    assert plain["error"] is None and plain["metrics"]["resumed_from"] == 2
    assert plain["best"] == [(1.0, 3), (2.0, 1)]
    assert guarded == plain
