"""An Accelerate loop that knows only Ray Train: ``accelerator.save_state`` into a directory
reported with ``ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))``, and
``accelerator.load_state`` from ``ray.train.get_checkpoint()`` after a restart. Unchanged
under RobustTrainer: watched, resumed after a kill, falling back past a damaged checkpoint,
rolled back after a NaN.

Accelerate's checkpoint holds the model, the optimizer (momentum) and each rank's RNG states;
the loop draws its batches from the torch RNG (seeded per rank by rayguard), so a resumed run
ends with exactly the weights of a run without the fault.
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
from ray.train.v2.api.exceptions import WorkerGroupError

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


def test_an_accelerate_loop_outlasting_the_watchdog_bounds_is_not_stalled(reference):
    result, run_dir = reference
    common.assert_clean(result, run_dir)
    assert result.metrics["step"] == STEPS
    assert len(common.checkpoint_dirs(run_dir)) == STEPS // SAVE
    common.assert_sealed(result, run_dir, STEPS // SAVE)


def test_a_killed_worker_resumes_through_accelerate_and_skips_a_damaged_checkpoint(
        reference, tmp_path):
    """Kill 1 (step 12): resume from the newest checkpoint (step 10) at step 11. Kill 2
    (step 22), the newest checkpoint (step 20) damaged first: it is rejected, the run
    resumes from step 15 at step 16. Both end where the fault-free run ends."""
    log = str(tmp_path / "steps.jsonl")
    run_dir = str(tmp_path / "faults")
    killer = KillAt(1, {12: False, 22: True}, str(tmp_path), run_dir)
    result, _ = _fit(tmp_path, "faults", hooks=[Record(log), killer])
    assert result.error is None
    assert common.starts(log) == [1, 11, 16]
    damaged = Path(tmp_path, "corrupted").read_text()
    assert json.loads(Path(damaged, STEP_FILE).read_text())["step"] == 20
    assert common.rejected_names(run_dir) == [os.path.basename(damaged)], common.events(run_dir)
    assert os.path.basename(damaged) in Path(run_dir, "rayguard_rejected.json").read_text()
    assert common.kinds(run_dir).count("restart") == 2
    expected, got = _weights(reference[0]), _weights(result)
    assert expected.keys() == got.keys()
    unequal = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not unequal, f"weights differ from the fault-free run: {unequal}"


def test_a_nan_loss_in_an_accelerate_loop_is_rolled_back(ray_local_module, tmp_path):
    """NaN at step 7, reported at once; the restart resumes from step 5 at step 6."""
    log = str(tmp_path / "steps.jsonl")
    result, run_dir = _fit(tmp_path, "nan", steps=10,
                           hooks=[Record(log), NanAt(7, str(tmp_path / "nan-fired"))])
    assert result.error is None
    log_kinds = common.kinds(run_dir)
    assert "nan_detected" in log_kinds and "restart" in log_kinds, log_kinds
    assert log_kinds.index("nan_detected") < log_kinds.index("restart")
    assert common.starts(log) == [1, 6]
    assert result.metrics["step"] == 10 and torch.isfinite(torch.tensor(result.metrics["loss"]))


def test_nan_policy_fail_ends_an_accelerate_run(ray_local_module, tmp_path):
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(nan_policy="fail"))
    with pytest.raises(WorkerGroupError) as info:
        _fit(tmp_path, "nan-fail", guard=guard, steps=10,
             hooks=[NanAt(3, str(tmp_path / "nan-fired"))])
    message = str(info.value)
    assert "NonFiniteMetricError" in message and "nan_policy='fail'" in message, message
    assert "restart" not in common.kinds(str(tmp_path / "nan-fail"))
