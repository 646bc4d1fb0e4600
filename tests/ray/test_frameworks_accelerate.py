"""An Accelerate loop that knows only Ray Train: ``accelerator.save_state`` into a directory
reported with ``ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))``, and
``accelerator.load_state`` from ``ray.train.get_checkpoint()`` after a restart. Unchanged
under RobustTrainer: watched, resumed after a kill, falling back past a damaged checkpoint,
rolled back after a NaN.

Accelerate's checkpoint holds the model, the optimizer (momentum) and each rank's RNG states;
the loop draws its batches from the torch RNG (seeded per rank by rayguard), so a resumed run
ends with exactly the weights of a run without the fault.

Two fits: ``reference`` (no fault) and ``faults``, every fault in sequence under live
recovery, one per attempt: attempt 0 ends with rank 1 killed at step 12; attempt 1 with rank
1 killed at step 22, the newest checkpoint (step 20) damaged first; attempt 2 with a NaN loss
on rank 0 at step 27, rolled back in place; attempt 3 runs to step 30. The tests read that
one run's event log and step log per attempt. What each stands for (the kill, NaN and
nan_policy="fail" fits of the three earlier tests, each a fit of its own):

- ``test_the_faults_run_finishes_every_step`` stands for the ``result.error is None`` and the
  final step and finite loss of ``test_a_nan_loss_in_an_accelerate_loop_is_rolled_back`` and
  ``test_a_killed_worker_resumes_through_accelerate_and_skips_a_damaged_checkpoint``;
- ``test_kill_1_...`` and ``test_kill_2_...`` for that kill test's starts ``[1, 11, 16]``,
  its rejected step-20 checkpoint (event and ``rayguard_rejected.json``) and its two
  restarts, now each checked in its attempt (the rank that died, the path, the checkpoint
  offered);
- ``test_a_nan_loss_...`` for the NaN test's ``nan_detected`` before its ``restart`` and its
  resume right after the checkpoint before the NaN, and for the metric named by the removed
  ``test_nan_policy_fail_ends_an_accelerate_run``;
- ``test_..._ends_with_the_weights_of_the_fault_free_run`` for the kill test's weight
  equality, the NaN now in the same run: the NaN step is redone from the checkpoint before it
  (step 25) with Accelerate's saved RNG states and the fault spent, so the replay is the
  fault-free run's steps 26-30, bit for bit.

``test_nan_policy_fail_ends_an_accelerate_run`` is gone: its decision (the run ends, with
rayguard's message, no restart) is made in the worker from the report, whatever the loop is,
and ``test_ray_report_loops.py::test_a_nan_with_policy_fail_ends_the_run_with_rayguards_message``
proves it; this loop is the user's own code, nothing of Accelerate's stands between the
report and the error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle
import ray.train
import safetensors.torch
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig

import rayguard

_spec = importlib.util.spec_from_file_location(
    "frameworks_common", Path(__file__).with_name("frameworks_common.py"))
common = sys.modules.setdefault("frameworks_common", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(common)
cloudpickle.register_pickle_by_value(common)  # workers cannot import tests/
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the loop below

STEPS, SAVE = 30, 5
STEP_FILE = "step.json"


def accelerate_loop(config):
    """Reports every step, a checkpoint every SAVE steps; ``config['hooks']`` run after each
    step with ``(step, loss, rank)`` and may replace the loss (fault injection)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = accelerator.prepare(model, opt)
    torch.manual_seed(rayguard.train.get_context().seed)  # this rank's data stream
    true_w = torch.arange(8, dtype=torch.float32) / 8

    start = 1
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            accelerator.load_state(d)  # model, optimizer, this rank's RNG states
            start = json.loads(Path(d, STEP_FILE).read_text())["step"] + 1

    for step in range(start, config["steps"] + 1):
        x = torch.randn(16, 8)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), x @ true_w)
        for hook in config.get("hooks", []):
            loss = hook(step, loss, accelerator.process_index)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        metrics = {"loss": loss.item(), "step": step}
        if step % SAVE:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as d:  # each rank its own: its RNG file
            accelerator.save_state(d)
            Path(d, STEP_FILE).write_text(json.dumps({"step": step}))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))


class Record:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, step, loss, rank):
        common.record_step(self.path, step)
        return loss


class Slow:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, step, loss, rank):
        time.sleep(self.seconds)
        return loss


class KillAt:
    """SIGKILL rank ``rank``'s own process at each step in ``steps`` (once each, marker
    files), once Ray has registered the newest checkpoint; where the value is True, first flip
    a byte of that checkpoint."""

    def __init__(self, rank: int, steps: dict[int, bool], marker_dir: str, run_dir: str) -> None:
        self.rank, self.steps, self.marker_dir, self.run_dir = rank, steps, marker_dir, run_dir

    def __call__(self, step, loss, rank):
        if (step in self.steps and rank == self.rank
                and common.fire_once(os.path.join(self.marker_dir, f"kill-{step}"))):
            corrupt = self.steps[step]
            common.kill_after_registered(
                self.run_dir, corrupt="model.safetensors" if corrupt else None,
                note=os.path.join(self.marker_dir, "corrupted"))
        return loss


class NanAt:
    """Rank 0's loss is NaN at step ``at`` (once per test: a marker file)."""

    def __init__(self, at: int, marker: str) -> None:
        self.at, self.marker = at, marker

    def __call__(self, step, loss, rank):
        if step == self.at and rank == 0 and common.fire_once(self.marker):
            return loss * float("nan")
        return loss


def _fit(tmp_path, name, *, hooks=(), guard=None, steps=STEPS):
    trainer = rayguard.RobustTrainer(
        accelerate_loop,
        train_loop_config={"steps": steps, "hooks": list(hooks)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name=name),
        guard_config=guard or rayguard.GuardConfig(),
    )
    return trainer.fit(), str(tmp_path / name)


def _weights(result) -> dict[str, torch.Tensor]:
    with result.checkpoint.as_directory() as d:
        return safetensors.torch.load_file(os.path.join(d, "model.safetensors"))


@pytest.fixture(scope="module")
def reference(ray_local_module, tmp_path_factory):
    """A run without faults whose steps (0.4 s) make it outlast both watchdog bounds."""
    tmp = tmp_path_factory.mktemp("accelerate-reference")
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(startup_timeout_s=10,
                                                              stall_timeout_s=10))
    return _fit(tmp, "reference", guard=guard, hooks=[Slow(0.4)])


@pytest.fixture(scope="module")
def faults(ray_local_module, tmp_path_factory):
    """Kill 1 (step 12), kill 2 (step 22, the step-20 checkpoint damaged first), then a NaN
    loss (step 27): one run, four attempts."""
    tmp = tmp_path_factory.mktemp("accelerate-faults")
    log, run_dir = str(tmp / "steps.jsonl"), str(tmp / "faults")
    hooks = [Record(log), KillAt(1, {12: False, 22: True}, str(tmp), run_dir),
             NanAt(27, str(tmp / "nan-fired"))]
    result, _ = _fit(tmp, "faults", hooks=hooks, guard=rayguard.GuardConfig(
        recovery="live", health=rayguard.HealthConfig(live_wait_s=common.LIVE_WAIT_S)))
    return common.FaultsRun(result, run_dir, log, str(tmp))


def test_an_accelerate_loop_outlasting_the_watchdog_bounds_is_not_stalled(reference):
    result, run_dir = reference
    common.assert_clean(result, run_dir)
    assert result.metrics["step"] == STEPS
    assert len(common.checkpoint_dirs(run_dir)) == STEPS // SAVE
    common.assert_sealed(result, run_dir, STEPS // SAVE)


def test_the_faults_run_finishes_every_step(faults):
    assert faults.result.error is None
    assert faults.result.metrics["step"] == STEPS
    assert torch.isfinite(torch.tensor(faults.result.metrics["loss"]))
    assert common.starts_by_attempt(faults.log) == {0: 1, 1: 11, 2: 16, 3: 26}
    assert common.kinds(faults.run_dir).count("restart") == 3


def test_kill_1_replaces_the_killed_rank_and_resumes_after_the_newest_checkpoint(faults):
    """Attempt 0 ends with rank 1's death at step 12; attempt 1 resumes from step 10."""
    common.assert_kill_recovered(faults.run_dir, faults.log, 0, 10, fallback=False)


def test_kill_2_skips_the_damaged_newest_checkpoint_for_the_one_before(faults):
    """Attempt 1 ends with rank 1's death at step 22, the step-20 checkpoint damaged first;
    attempt 2 rejects it and resumes from step 15."""
    damaged = faults.damaged()
    assert json.loads(Path(damaged, STEP_FILE).read_text())["step"] == 20
    common.assert_rejected_once(faults.run_dir, damaged, 2)
    common.assert_kill_recovered(faults.run_dir, faults.log, 1, 15, fallback=True)


def test_a_nan_loss_in_an_accelerate_loop_is_rolled_back_in_place(faults):
    """Attempt 2 ends with rank 0's NaN loss at step 27, reported at once; every rank
    re-enters the loop in its own process (attempt 3) from step 25."""
    detected = common.per_attempt(faults.run_dir, "nan_detected", "step", "detail")
    assert list(detected) == [2], detected
    assert all(step == 27 and "metric 'loss' is nan" in detail
               for step, detail in detected[2]), detected
    order = [(e["kind"], e["attempt"]) for e in common.events(faults.run_dir)]
    assert order.index(("nan_detected", 2)) < order.index(("restart", 2))
    assert common.per_attempt(faults.run_dir, "restart", "cause", "path")[2] == [
        ("nan", "in_place")]
    assert common.per_attempt(faults.run_dir, "worker_died", "rank").keys() == {0, 1}
    assert common.per_attempt(faults.run_dir, "restored", "step", "fallback")[3] == [
        (25, False)]
    assert common.starts_by_attempt(faults.log)[3] == 26


def test_the_faults_run_ends_with_the_weights_of_the_fault_free_run(reference, faults):
    common.assert_same_weights(_weights(reference[0]), _weights(faults.result))
