"""A Hugging Face Transformers loop written as Ray Train's docs write it
(``RayTrainReportCallback``, ``prepare_trainer``, ``trainer.train(resume_from_checkpoint=)``
from ``ray.train.get_checkpoint()``: examples/hf_transformers.py), unchanged, under
RobustTrainer: watched, resumed after a kill, falling back past a damaged checkpoint, rolled
back after a NaN, and restarted by ``rayguard.tune.run`` when its trial turns unhealthy.

Transformers makes this loop deterministic: the same initial weights (``set_seed``), one data
order on every rank (``data_seed``) and, in its checkpoint, the optimizer, the scheduler,
each rank's RNG states and the step to skip the data loader to. A resumed run therefore ends
with exactly the weights of a run without the fault.
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
from ray.train.v2.api.exceptions import WorkerGroupError

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
    """The example's tiny GPT-2 whose ``at``-th training forward on rank 0 returns a NaN loss
    (once per test: a marker file): its gradient poisons every weight through DDP."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, labels=labels, **kwargs)
        if self.training:
            self.calls = getattr(self, "calls", 0) + 1
            if (self.calls == self.nan_at and rayguard.train.get_context().rank == 0
                    and common.fire_once(self.nan_marker)):
                out.loss = out.loss * float("nan")
        return out


def nan_gpt2(marker: str, at: int) -> NanOnce:
    model = NanOnce(example.tiny_gpt2().config)
    model.nan_marker, model.nan_at = marker, at
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


def test_a_transformers_loop_outlasting_the_watchdog_bounds_is_not_stalled(reference):
    result, run_dir = reference
    common.assert_clean(result, run_dir)
    assert result.metrics["step"] == STEPS
    assert len(common.checkpoint_dirs(run_dir)) == STEPS // SAVE
    common.assert_sealed(result, run_dir, STEPS // SAVE)


def test_a_killed_worker_resumes_through_transformers_and_skips_a_damaged_checkpoint(
        reference, tmp_path):
    """Kill 1 (step 10): resume from the newest checkpoint (step 8) at step 9. Kill 2
    (step 18), the newest checkpoint (step 16) damaged first: it is rejected, the run
    resumes from step 12 at step 13. Both resumes end where the fault-free run ends."""
    log = str(tmp_path / "steps.jsonl")
    run_dir = str(tmp_path / "faults")
    killer = KillAt(1, {10: False, 18: True}, str(tmp_path), run_dir)
    result, _ = _fit(tmp_path, "faults", callbacks=[Recorder(log), killer])
    assert result.error is None
    assert common.starts(log) == [1, 9, 13]
    damaged = Path(tmp_path, "corrupted").read_text()
    assert _step_of(damaged) == 16
    assert common.rejected_names(run_dir) == [os.path.basename(damaged)], common.events(run_dir)
    assert os.path.basename(damaged) in Path(run_dir, "rayguard_rejected.json").read_text()
    assert common.kinds(run_dir).count("restart") == 2
    expected, got = _weights(reference[0]), _weights(result)
    assert expected.keys() == got.keys()
    unequal = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not unequal, f"weights differ from the fault-free run: {unequal}"


# Transformers' default logging_nan_inf_filter=True logs a NaN step's loss as the running
# mean (and 0.0 once every step is NaN): the NaN shows in the logged grad_norm.
WATCH = ("loss", "grad_norm")


def test_a_nan_loss_in_a_transformers_loop_is_rolled_back(ray_local_module, tmp_path):
    """NaN at step 6; the report at step 8 carries it; the restart resumes from step 4."""
    log = str(tmp_path / "steps.jsonl")
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(watch_metrics=WATCH))
    result, run_dir = _fit(tmp_path, "nan", guard=guard, callbacks=[Recorder(log)],
                           max_steps=12, model_fn=functools.partial(
                               nan_gpt2, str(tmp_path / "nan-fired"), 6))
    assert result.error is None
    log_kinds = common.kinds(run_dir)
    assert "nan_detected" in log_kinds and "restart" in log_kinds, log_kinds
    assert log_kinds.index("nan_detected") < log_kinds.index("restart")
    assert common.starts(log) == [1, 5]
    assert result.metrics["step"] == 12 and torch.isfinite(torch.tensor(result.metrics["loss"]))


def test_nan_policy_fail_ends_a_transformers_run(ray_local_module, tmp_path):
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(watch_metrics=WATCH,
                                                              nan_policy="fail"))
    with pytest.raises(WorkerGroupError) as info:
        _fit(tmp_path, "nan-fail", guard=guard, max_steps=8,
             model_fn=functools.partial(nan_gpt2, str(tmp_path / "nan-fired"), 2))
    message = str(info.value)
    assert "NonFiniteMetricError" in message and "nan_policy='fail'" in message, message
    assert "grad_norm" in message
    assert "restart" not in common.kinds(str(tmp_path / "nan-fail"))


def trial_fn(config):
    from ray.tune.integration.ray_train import TuneReportCallback

    rayguard.RobustTrainer(
        example.train_func,
        train_loop_config={
            "max_steps": 20, "save_steps": SAVE,
            "callbacks": [SlowSteps(0.4), Recorder(config["log"])],
            "model_fn": functools.partial(nan_gpt2, config["marker"], 6)},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=config["storage"], name="inner",
                             callbacks=[TuneReportCallback()]),
        # The trainer inside leaves the loss to the sweep's health check (it watches only
        # eval_loss, which this loop never reports), so the NaN reaches Tune.
        guard_config=rayguard.GuardConfig(
            numa="off", health=rayguard.HealthConfig(watch_metrics=("eval_loss",))),
    ).fit()


def test_tune_restarts_an_unhealthy_transformers_trial_from_its_last_good_checkpoint(
        ray_local_module, tmp_path):
    from ray import tune

    import rayguard.tune as rt

    log = str(tmp_path / "steps.jsonl")
    health = rayguard.HealthConfig(watch_metrics=WATCH, stall_timeout_s=120, max_restarts=2,
                                   throughput_collapse_fraction=None,
                                   memory_growth_fraction=None)
    run = rt.run(trial_fn,
                 param_space={"marker": str(tmp_path / "nan-fired"), "storage": str(tmp_path),
                              "log": log},
                 run_config=tune.RunConfig(storage_path=str(tmp_path / "tune")),
                 health=health)
    grid = run.wait(timeout=600)
    assert not grid.errors
    restarts = run.events(kind="restart")
    assert len(restarts) == 1, run.events()
    chosen = restarts[0].data["checkpoint_path"]
    assert _step_of(chosen) == 4  # the last checkpoint before the NaN (step 6)
    assert common.starts(log) == [1, 5]  # the trainer inside resumed right after it
    assert grid[0].metrics["step"] == 20
