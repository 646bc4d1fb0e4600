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

Two fits: ``reference`` (no fault) and ``faults``, every fault in sequence under live
recovery, one per attempt (B = 8 steps an epoch; a checkpoint's step is Lightning's
global step at its epoch's end): attempt 0 ends with rank 1 killed in epoch 2; attempt 1
with rank 1 killed in epoch 4, the newest checkpoint (end of epoch 3) damaged first;
attempt 2, back in epoch 4, with a NaN loss on rank 0 at its batch 5, reported at the
epoch's end and rolled back in place; attempt 3 runs epochs 4 and 5. The tests read that
one run's event log and step log per attempt. What each stands for (the kill, NaN and
nan_policy="fail" fits of the three earlier tests, each a fit of its own):

- ``test_the_faults_run_finishes_every_epoch`` stands for the ``result.error is None``,
  the final epoch and finite loss of ``test_a_nan_loss_in_a_lightning_loop_is_rolled_back``
  and ``test_a_killed_worker_resumes_through_lightning_and_skips_a_damaged_checkpoint``;
- ``test_kill_1_...`` and ``test_kill_2_...`` for that kill test's starts
  ``[1, 2B + 1, 3B + 1]``, its rejected checkpoint (event and ``rayguard_rejected.json``)
  and its two restarts, now each checked in its attempt (the rank that died, the path, the
  checkpoint offered);
- ``test_a_nan_loss_...`` for the NaN test's ``nan_detected`` before its ``restart`` and its
  resume at the start of the epoch after the checkpoint before the NaN, and for the metric
  (``train_loss``) named by the removed ``test_nan_policy_fail_ends_a_lightning_run``;
- ``test_..._ends_with_the_weights_of_the_fault_free_run`` for the kill test's weight
  equality, the NaN now in the same run: epoch 4 is redone from the end of epoch 3 (the
  sampler's order is the epoch's, the fault spent), so the replay is the fault-free run's.

``test_nan_policy_fail_ends_a_lightning_run`` is gone: its decision (the run ends, with
rayguard's message, no restart) is made in the worker from the report, and
``test_ray_report_loops.py::test_a_nan_with_policy_fail_ends_the_run_with_rayguards_message``
proves it. What only Lightning could change, its error handling between the report and the
worker (``_call_and_handle_interrupt`` tears down and re-raises any ``BaseException``), is
crossed here by the rollback's own exception at the NaN.
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


@pytest.fixture(scope="module")
def reference(ray_local_module, tmp_path_factory):
    """A run without faults whose steps (0.25 s) make it outlast both watchdog bounds."""
    tmp = tmp_path_factory.mktemp("lightning-reference")
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(startup_timeout_s=10,
                                                              stall_timeout_s=10))
    return _fit(tmp, "reference", guard=guard, callbacks=[SlowSteps(0.25)])


NAN_AT = 4 * BATCHES + 5  # Lightning's global_step (steps done) at rank 0's NaN: epoch 4, batch 5


@pytest.fixture(scope="module")
def faults(ray_local_module, tmp_path_factory):
    """Kill 1 (epoch 2), kill 2 (epoch 4, the end-of-epoch-3 checkpoint damaged first), then
    a NaN loss (epoch 4 again, after the kill's batch): one run, four attempts."""
    tmp = tmp_path_factory.mktemp("lightning-faults")
    log, run_dir = str(tmp / "steps.jsonl"), str(tmp / "faults")
    killer = KillAt(1, {2: False, 4: True}, str(tmp), run_dir)
    module = functools.partial(NanOnce, str(tmp / "nan-fired"), NAN_AT)
    result, _ = _fit(tmp, "faults", callbacks=[Recorder(log), killer], module_fn=module,
                     guard=rayguard.GuardConfig(recovery="live", health=rayguard.HealthConfig(
                         live_wait_s=common.LIVE_WAIT_S)))
    return common.FaultsRun(result, run_dir, log, str(tmp))


def test_a_lightning_loop_outlasting_the_watchdog_bounds_is_not_stalled(reference):
    result, run_dir = reference
    common.assert_clean(result, run_dir)
    assert result.metrics["epoch"] == EPOCHS - 1
    assert len(common.checkpoint_dirs(run_dir)) == EPOCHS
    common.assert_sealed(result, run_dir, EPOCHS)


def test_the_faults_run_finishes_every_epoch(faults):
    assert faults.result.error is None
    assert faults.result.metrics["epoch"] == EPOCHS - 1
    assert torch.isfinite(torch.tensor(faults.result.metrics["train_loss"]))
    # global steps: epoch e starts after e * BATCHES completed steps
    assert common.starts_by_attempt(faults.log) == {
        0: 1, 1: 2 * BATCHES + 1, 2: 3 * BATCHES + 1, 3: 4 * BATCHES + 1}
    assert common.kinds(faults.run_dir).count("restart") == 3


def test_kill_1_replaces_the_killed_rank_and_resumes_after_the_newest_checkpoint(faults):
    """Attempt 0 ends with rank 1's death in epoch 2; attempt 1 resumes from the end of
    epoch 1."""
    common.assert_kill_recovered(faults.run_dir, faults.log, 0, 2 * BATCHES, fallback=False)


def test_kill_2_skips_the_damaged_newest_checkpoint_for_the_one_before(faults):
    """Attempt 1 ends with rank 1's death in epoch 4, the end-of-epoch-3 checkpoint damaged
    first; attempt 2 rejects it and resumes from the end of epoch 2."""
    damaged = faults.damaged()  # its file no longer loads: its step from its commit
    committed = {e["path"]: e["step"] for e in common.events(faults.run_dir)
                 if e["kind"] == "checkpoint_committed"}
    assert committed[damaged] == 4 * BATCHES  # the end of epoch 3
    common.assert_rejected_once(faults.run_dir, damaged, 2)
    common.assert_kill_recovered(faults.run_dir, faults.log, 1, 3 * BATCHES, fallback=True)


def test_a_nan_loss_in_a_lightning_loop_is_rolled_back_in_place(faults):
    """Attempt 2 ends with rank 0's NaN loss in epoch 4, carried by the report at the epoch's
    end (every rank's, ``train_loss`` is synced); every rank re-enters the loop in its own
    process (attempt 3) from the end of epoch 3."""
    detected = common.per_attempt(faults.run_dir, "nan_detected", "step", "detail")
    assert list(detected) == [2], detected
    assert all(step == 5 * BATCHES and "metric 'train_loss' is nan" in detail
               for step, detail in detected[2]), detected
    order = [(e["kind"], e["attempt"]) for e in common.events(faults.run_dir)]
    assert order.index(("nan_detected", 2)) < order.index(("restart", 2))
    assert common.per_attempt(faults.run_dir, "restart", "cause", "path")[2] == [
        ("nan", "in_place")]
    assert common.per_attempt(faults.run_dir, "worker_died", "rank").keys() == {0, 1}
    assert common.per_attempt(faults.run_dir, "restored", "step", "fallback")[3] == [
        (4 * BATCHES, False)]
    assert common.starts_by_attempt(faults.log)[3] == 4 * BATCHES + 1


def test_the_faults_run_ends_with_the_weights_of_the_fault_free_run(reference, faults):
    common.assert_same_weights(_weights(reference[0]), _weights(faults.result))
