"""A PyTorch Lightning loop written as Ray Train's docs write it (``RayDDPStrategy``,
``RayLightningEnvironment``, ``RayTrainReportCallback``, ``prepare_trainer``,
``trainer.fit(ckpt_path=)`` from ``ray.train.get_checkpoint()``: examples/lightning_loop.py),
unchanged, under RobustTrainer: watched, resumed after a kill, falling back past a damaged
checkpoint, rolled back after a NaN.

``RayTrainReportCallback`` reports (and checkpoints) at each epoch end, so a restart resumes
at the start of the epoch after the checkpoint. Lightning makes this loop deterministic: the
same initial weights, one data order per epoch on every rank (its ``DistributedSampler``,
seed 0, ``set_epoch``), the optimizer and the loop position in its checkpoint; the model has
no randomness of its own. A resumed run therefore ends with the fault-free run's weights.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import ray.cloudpickle as cloudpickle
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard

_spec = importlib.util.spec_from_file_location(
    "frameworks_common", Path(__file__).with_name("frameworks_common.py"))
common = sys.modules.setdefault("frameworks_common", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(common)
cloudpickle.register_pickle_by_value(common)  # workers cannot import tests/
example = common.example("lightning_loop")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the callbacks below

CKPT_FILE = "checkpoint.ckpt"  # in a Ray checkpoint of RayTrainReportCallback
EPOCHS = 6
BATCHES = 8  # per epoch and rank: 256 samples, batch 16, 2 ranks


class Recorder(pl.Callback):
    """Each completed step (Lightning's global_step), with rayguard's rank, attempt, pid."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        common.record_step(self.path, trainer.global_step)


class SlowSteps(pl.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


class KillAt(pl.Callback):
    """SIGKILL rank ``rank``'s own process at batch 3 of each epoch in ``epochs`` (once each, marker
    files), once Ray has registered the newest checkpoint; where the value is True, first flip
    a byte of that checkpoint."""

    def __init__(self, rank: int, epochs: dict[int, bool], marker_dir: str, run_dir: str) -> None:
        self.rank, self.epochs, self.marker_dir, self.run_dir = rank, epochs, marker_dir, run_dir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        epoch = trainer.current_epoch
        if (epoch in self.epochs and batch_idx == 3 and trainer.global_rank == self.rank
                and common.fire_once(os.path.join(self.marker_dir, f"kill-{epoch}"))):
            corrupt = self.epochs[epoch]
            common.kill_after_registered(
                self.run_dir, corrupt=CKPT_FILE if corrupt else None,
                note=os.path.join(self.marker_dir, "corrupted"))


class NanOnce(example.Regression):
    """The example's module whose ``at``-th training step on rank 0 returns a NaN loss (once
    per test: a marker file): its gradient poisons the weights of every rank through DDP."""

    def __init__(self, marker: str, at: int) -> None:
        super().__init__()
        self.nan_marker, self.nan_at = marker, at

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        if (self.trainer.global_step == self.nan_at and self.global_rank == 0
                and common.fire_once(self.nan_marker)):
            loss = loss * float("nan")
        self.log("train_loss", loss, sync_dist=True)
        return loss


def _fit(tmp_path, name, *, callbacks=(), guard=None, **config):
    trainer = rayguard.RobustTrainer(
        example.train_func,
        train_loop_config={"epochs": EPOCHS, "callbacks": list(callbacks), **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name=name),
        guard_config=guard or rayguard.GuardConfig(),
    )
    return trainer.fit(), str(tmp_path / name)


def _weights(result) -> dict[str, torch.Tensor]:
    with result.checkpoint.as_directory() as d:
        return torch.load(os.path.join(d, CKPT_FILE), weights_only=False)["state_dict"]


def _epoch_of(checkpoint_dir: str) -> int:
    return torch.load(os.path.join(checkpoint_dir, CKPT_FILE), weights_only=False)["epoch"]


@pytest.fixture(scope="module")
def reference(ray_local_module, tmp_path_factory):
    """A run without faults whose steps (0.25 s) make it outlast both watchdog bounds."""
    tmp = tmp_path_factory.mktemp("lightning-reference")
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(startup_timeout_s=10,
                                                              stall_timeout_s=10))
    return _fit(tmp, "reference", guard=guard, callbacks=[SlowSteps(0.25)])


def test_a_lightning_loop_outlasting_the_watchdog_bounds_is_not_stalled(reference):
    result, run_dir = reference
    common.assert_clean(result, run_dir)
    assert result.metrics["epoch"] == EPOCHS - 1
    assert len(common.checkpoint_dirs(run_dir)) == EPOCHS
    common.assert_sealed(result, run_dir, EPOCHS)


def test_a_killed_worker_resumes_through_lightning_and_skips_a_damaged_checkpoint(
        reference, tmp_path):
    """Kill 1 (epoch 2): resume from the newest checkpoint (end of epoch 1) at epoch 2.
    Kill 2 (epoch 4), the newest checkpoint (end of epoch 3) damaged first: it is rejected,
    the run resumes from the end of epoch 2 at epoch 3. Both end where the fault-free run
    ends."""
    log = str(tmp_path / "steps.jsonl")
    run_dir = str(tmp_path / "faults")
    killer = KillAt(1, {2: False, 4: True}, str(tmp_path), run_dir)
    result, _ = _fit(tmp_path, "faults", callbacks=[Recorder(log), killer])
    assert result.error is None
    # global steps: epoch e starts after e * BATCHES completed steps
    assert common.starts(log) == [1, 2 * BATCHES + 1, 3 * BATCHES + 1]
    damaged = Path(tmp_path, "corrupted").read_text()
    assert common.rejected_names(run_dir) == [os.path.basename(damaged)], common.events(run_dir)
    assert os.path.basename(damaged) in Path(run_dir, "rayguard_rejected.json").read_text()
    assert common.kinds(run_dir).count("restart") == 2
    expected, got = _weights(reference[0]), _weights(result)
    assert expected.keys() == got.keys()
    unequal = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not unequal, f"weights differ from the fault-free run: {unequal}"


def test_a_nan_loss_in_a_lightning_loop_is_rolled_back(ray_local_module, tmp_path):
    """NaN at step 2 * BATCHES + 2 (epoch 2); the report at the end of epoch 2 carries it; the
    restart resumes from the end of epoch 1."""
    log = str(tmp_path / "steps.jsonl")
    module = functools.partial(NanOnce, str(tmp_path / "nan-fired"), 2 * BATCHES + 2)
    result, run_dir = _fit(tmp_path, "nan", callbacks=[Recorder(log)], epochs=4,
                           module_fn=module)
    assert result.error is None
    log_kinds = common.kinds(run_dir)
    assert "nan_detected" in log_kinds and "restart" in log_kinds, log_kinds
    assert log_kinds.index("nan_detected") < log_kinds.index("restart")
    assert common.starts(log) == [1, 2 * BATCHES + 1]
    assert result.metrics["epoch"] == 3 and torch.isfinite(torch.tensor(result.metrics["train_loss"]))


def test_nan_policy_fail_ends_a_lightning_run(ray_local_module, tmp_path):
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(nan_policy="fail"))
    with pytest.raises(WorkerGroupError) as info:
        _fit(tmp_path, "nan-fail", guard=guard, epochs=2,
             module_fn=functools.partial(NanOnce, str(tmp_path / "nan-fired"), 2))
    message = str(info.value)
    assert "NonFiniteMetricError" in message and "nan_policy='fail'" in message, message
    assert "train_loss" in message
    assert "restart" not in common.kinds(str(tmp_path / "nan-fail"))
