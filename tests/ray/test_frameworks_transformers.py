"""A Hugging Face Transformers loop written as Ray Train's docs write it
(``RayTrainReportCallback``, ``prepare_trainer``, ``trainer.train(resume_from_checkpoint=)``
from ``ray.train.get_checkpoint()``: examples/hf_transformers.py), unchanged, under
RobustTrainer: watched, resumed after a kill, falling back past a damaged checkpoint, rolled
back after a NaN. (A trial restarted by ``rayguard.tune.run`` from the checkpoint before a NaN,
a fit of this file's before, is proved for the loop shape this example has, a checkpoint
reported through ``ray.train.report`` and resumed from ``ray.train.get_checkpoint()``, by
``test_tune_robust_trainer.py``'s ``ray`` trial; the Transformers checkpoint's own resume by
the faults fit here.)

Transformers makes this loop deterministic: the same initial weights (``set_seed``), one data
order on every rank (``data_seed``) and, in its checkpoint, the optimizer, the scheduler,
each rank's RNG states and the step to skip the data loader to. A resumed run therefore ends
with exactly the weights of a run without the fault.

Two fits for the trainer: ``reference`` (no fault) and ``faults``, every fault in sequence
under live recovery, one per attempt (a checkpoint every 4 steps): attempt 0 ends with rank 1
killed at step 10; attempt 1 with rank 1 killed at step 18, the newest checkpoint (step 16)
damaged first; attempt 2 with a NaN loss on rank 0 at step 19, carried by the report at step
20 and rolled back in place; attempt 3 runs to step 24. The tests read that one run's event
log and step log per attempt. What each stands for (the kill, NaN and nan_policy="fail" fits
of the three earlier tests, each a fit of its own):

- ``test_the_faults_run_finishes_every_step`` stands for the ``result.error is None``, the
  final step and finite loss of ``test_a_nan_loss_in_a_transformers_loop_is_rolled_back``
  and ``test_a_killed_worker_resumes_through_transformers_and_skips_a_damaged_checkpoint``;
- ``test_kill_1_...`` and ``test_kill_2_...`` for that kill test's starts ``[1, 9, 13]``,
  its rejected step-16 checkpoint (event and ``rayguard_rejected.json``) and its two
  restarts, now each checked in its attempt (the rank that died, the path, the checkpoint
  offered);
- ``test_a_nan_loss_...`` for the NaN test's ``nan_detected`` before its ``restart`` and its
  resume right after the checkpoint before the NaN (here attempt 2's own step-16 checkpoint,
  not the rejected one of the same step), and for the metric (``grad_norm``) named by the
  removed ``test_nan_policy_fail_ends_a_transformers_run``;
- ``test_..._ends_with_the_weights_of_the_fault_free_run`` for the kill test's weight
  equality, the NaN now in the same run: steps 17-20 are redone from the step-16 checkpoint
  (optimizer, scheduler, each rank's RNG states, the data position; the fault spent), so the
  replay is the fault-free run's. The NaN model is built from the RNG state the example's
  own model is built from (``nan_gpt2``), so it starts from the reference's weights.

``test_nan_policy_fail_ends_a_transformers_run`` is gone: its decision (the run ends, with
rayguard's message, no restart) is made in the worker from the report, and
``test_ray_report_loops.py::test_a_nan_with_policy_fail_ends_the_run_with_rayguards_message``
proves it. What only Transformers could change, its handling between the report (in its
callback) and the worker, is crossed here by the rollback's own exception at the NaN; the
watched metric that carries a NaN in these reports (``grad_norm``) is checked above.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle
import safetensors.torch
import torch
import transformers
from ray.train import RunConfig, ScalingConfig

import rayguard

_spec = importlib.util.spec_from_file_location(
    "frameworks_common", Path(__file__).with_name("frameworks_common.py"))
common = sys.modules.setdefault("frameworks_common", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(common)
cloudpickle.register_pickle_by_value(common)  # workers cannot import tests/
example = common.example("hf_transformers")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the callbacks below

MODEL_FILE = "checkpoint/model.safetensors"  # in a Ray checkpoint of RayTrainReportCallback
STEPS, SAVE = 24, 4


class Recorder(transformers.TrainerCallback):
    """Each completed step, with rayguard's rank, attempt and pid."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_step_end(self, args, state, control, **kwargs):
        common.record_step(self.path, state.global_step)


class SlowSteps(transformers.TrainerCallback):
    """Each step waits ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


class KillAt(transformers.TrainerCallback):
    """SIGKILL rank ``rank``'s own process at the end of each step in ``steps`` (once each, marker
    files), once Ray has registered the newest checkpoint; where the value is True, first flip
    a byte of that checkpoint."""

    def __init__(self, rank: int, steps: dict[int, bool], marker_dir: str, run_dir: str) -> None:
        self.rank, self.steps, self.marker_dir, self.run_dir = rank, steps, marker_dir, run_dir

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if (step in self.steps and args.process_index == self.rank
                and common.fire_once(os.path.join(self.marker_dir, f"kill-{step}"))):
            corrupt = self.steps[step]
            common.kill_after_registered(
                self.run_dir, corrupt=MODEL_FILE if corrupt else None,
                note=os.path.join(self.marker_dir, "corrupted"))


class NanOnce(transformers.GPT2LMHeadModel):
    """The example's tiny GPT-2 whose training forward on rank 0 returns a NaN loss once (a
    marker file, across processes): the one :class:`NanAtStep` arms. Its gradient poisons
    every weight through DDP."""

    nan_armed = False

    def forward(self, input_ids=None, labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, labels=labels, **kwargs)
        if self.training:
            due, self.nan_armed = self.nan_armed, False
            if (due and rayguard.train.get_context().rank == 0
                    and common.fire_once(self.nan_marker)):
                out.loss = out.loss * float("nan")
        return out


class NanAtStep(transformers.TrainerCallback):
    """Arms the model's NaN (:class:`NanOnce`) for global step ``at``, in
    whichever attempt reaches it first."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.at:
            model.nan_armed = True


def nan_gpt2(marker: str) -> NanOnce:
    with torch.random.fork_rng():  # the config only: the weights from train_func's seed
        config = example.tiny_gpt2().config
    model = NanOnce(config)
    model.nan_marker = marker
    return model


def _fit(tmp_path, name, *, callbacks=(), guard=None, workers=2, **config):
    trainer = rayguard.RobustTrainer(
        example.train_func,
        train_loop_config={"max_steps": STEPS, "save_steps": SAVE, "callbacks": list(callbacks),
                           **config},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(storage_path=str(tmp_path), name=name),
        guard_config=guard or rayguard.GuardConfig(),
    )
    return trainer.fit(), str(tmp_path / name)


def _weights(result) -> dict[str, torch.Tensor]:
    with result.checkpoint.as_directory() as d:
        return safetensors.torch.load_file(os.path.join(d, MODEL_FILE))


def _step_of(checkpoint_dir: str) -> int:
    state = Path(checkpoint_dir, "checkpoint", "trainer_state.json").read_text()
    return json.loads(state)["global_step"]


@pytest.fixture(scope="module")
def reference(ray_local_module, tmp_path_factory):
    """A run without faults whose steps (0.5 s) make it outlast both watchdog bounds."""
    tmp = tmp_path_factory.mktemp("hf-reference")
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(startup_timeout_s=10,
                                                              stall_timeout_s=10))
    result, run_dir = _fit(tmp, "reference", guard=guard,
                           callbacks=[SlowSteps(0.5), Recorder(str(tmp / "steps.jsonl"))])
    return result, run_dir


# Transformers' default logging_nan_inf_filter=True logs a NaN step's loss as the running
# mean (and 0.0 once every step is NaN): the NaN shows in the logged grad_norm.
WATCH = ("loss", "grad_norm")


@pytest.fixture(scope="module")
def faults(ray_local_module, tmp_path_factory):
    """Kill 1 (step 10), kill 2 (step 18, the step-16 checkpoint damaged first), then a NaN
    loss (step 19): one run, four attempts."""
    tmp = tmp_path_factory.mktemp("hf-faults")
    log, run_dir = str(tmp / "steps.jsonl"), str(tmp / "faults")
    killer = KillAt(1, {10: False, 18: True}, str(tmp), run_dir)
    guard = rayguard.GuardConfig(recovery="live",
                                 health=rayguard.HealthConfig(watch_metrics=WATCH,
                                                              live_wait_s=common.LIVE_WAIT_S))
    result, _ = _fit(tmp, "faults", guard=guard,
                     callbacks=[Recorder(log), killer, NanAtStep(19)],
                     model_fn=functools.partial(nan_gpt2, str(tmp / "nan-fired")))
    return common.FaultsRun(result, run_dir, log, str(tmp))


def test_a_transformers_loop_outlasting_the_watchdog_bounds_is_not_stalled(reference):
    result, run_dir = reference
    common.assert_clean(result, run_dir)
    assert result.metrics["step"] == STEPS
    assert len(common.checkpoint_dirs(run_dir)) == STEPS // SAVE
    common.assert_sealed(result, run_dir, STEPS // SAVE)


def test_the_faults_run_finishes_every_step(faults):
    assert faults.result.error is None
    assert faults.result.metrics["step"] == STEPS
    assert torch.isfinite(torch.tensor(faults.result.metrics["loss"]))
    assert common.starts_by_attempt(faults.log) == {0: 1, 1: 9, 2: 13, 3: 17}
    assert common.kinds(faults.run_dir).count("restart") == 3


def test_kill_1_replaces_the_killed_rank_and_resumes_after_the_newest_checkpoint(faults):
    """Attempt 0 ends with rank 1's death at step 10; attempt 1 resumes from step 8."""
    common.assert_kill_recovered(faults.run_dir, faults.log, 0, 8, fallback=False)


def test_kill_2_skips_the_damaged_newest_checkpoint_for_the_one_before(faults):
    """Attempt 1 ends with rank 1's death at step 18, the step-16 checkpoint damaged first;
    attempt 2 rejects it and resumes from step 12."""
    damaged = faults.damaged()
    assert _step_of(damaged) == 16
    common.assert_rejected_once(faults.run_dir, damaged, 2)
    common.assert_kill_recovered(faults.run_dir, faults.log, 1, 12, fallback=True)


def test_a_nan_loss_in_a_transformers_loop_is_rolled_back_in_place(faults):
    """Attempt 2 ends with rank 0's NaN loss at step 19, carried by every rank's report at
    step 20 (``grad_norm``, reduced across ranks); every rank re-enters the loop in its own
    process (attempt 3) from attempt 2's own step-16 checkpoint."""
    detected = common.per_attempt(faults.run_dir, "nan_detected", "step", "detail")
    assert list(detected) == [2], detected
    assert all(step == 20 and "metric 'grad_norm' is nan" in detail
               for step, detail in detected[2]), detected
    order = [(e["kind"], e["attempt"]) for e in common.events(faults.run_dir)]
    assert order.index(("nan_detected", 2)) < order.index(("restart", 2))
    assert common.per_attempt(faults.run_dir, "restart", "cause", "path")[2] == [
        ("nan", "in_place")]
    assert common.per_attempt(faults.run_dir, "worker_died", "rank").keys() == {0, 1}
    restored = common.per_attempt(faults.run_dir, "restored", "step", "fallback", "path")[3]
    assert [(step, fallback) for step, fallback, _ in restored] == [(16, False)]
    assert restored[0][2] != faults.damaged()  # attempt 2's own step-16 checkpoint
    assert common.starts_by_attempt(faults.log)[3] == 17


def test_the_faults_run_ends_with_the_weights_of_the_fault_free_run(reference, faults):
    common.assert_same_weights(_weights(reference[0]), _weights(faults.result))
