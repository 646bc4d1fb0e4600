"""Verified checkpoints inside RobustTrainer runs, with real faults on disk and in processes:
a corrupt or truncated latest checkpoint, a worker killed mid-commit, a full disk, and a
restore with another world size."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from ray.train import CheckpointConfig, RunConfig, ScalingConfig

import rayguard
from rayguard import checkpoint as ck
from rayguard.events import read as read_events
from rayguard.testing.forge import flip_byte


def ckpt_loop(config):
    import rayguard.checkpoint.fsio as fsio

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.load_state_dict(state["model"])
    if config.get("kill_in_commit_at") is not None and ctx.attempt == 0 and ctx.rank == 0:
        def die_before_publish(phase, path):
            if phase == "manifest-written" and f"{config['kill_in_commit_at']:09d}" in path:
                os.kill(os.getpid(), 9)
        fsio.set_phase_hook(die_before_publish)
    for step in range(start, config["steps"]):
        with torch.no_grad():
            model.weight.add_(0.01)
        if [ctx.attempt, step] in config.get("fill_disk_at", []) and ctx.rank == 0:
            with fsio.inject_write_error(errno.ENOSPC):
                rayguard.train.report({"loss": 1.0, "step": step},
                                      state={"model": model.state_dict(), "step": step})
        rayguard.train.report({"loss": 1.0, "step": step, "start": start,
                               "world": ctx.world_size},
                              state={"model": model.state_dict(), "step": step}
                              if ctx.rank == 0 else None)


def _trainer(tmp_path, name, steps, *, workers=2, keep=None, restarts=3, **config):
    return rayguard.RobustTrainer(
        ckpt_loop, train_loop_config={"steps": steps, **config},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(storage_path=str(tmp_path), name=name,
                             checkpoint_config=CheckpointConfig(num_to_keep=keep)),
        guard_config=rayguard.GuardConfig(
            numa="off", health=rayguard.HealthConfig(max_restarts=restarts)))


def _committed(run_dir):
    return sorted(p for p in os.listdir(run_dir)
                  if p.startswith("checkpoint_") and os.path.isdir(os.path.join(run_dir, p)))


@pytest.mark.compat  # also run on the oldest supported Ray
def test_corrupt_latest_falls_back_and_other_world_size_resumes(ray_local, tmp_path, run_cli):
    result = _trainer(tmp_path, "run", steps=5, keep=3).fit()
    names = _committed(result.path)
    assert len(names) == 3  # CheckpointConfig(num_to_keep=3) still works
    assert result.checkpoint.path.endswith(names[-1])
    newest, second, third = (os.path.join(result.path, n) for n in reversed(names))
    shard = next(p for p in os.listdir(newest) if p.endswith(".safetensors"))
    flip_byte(os.path.join(newest, shard), 200)
    shard2 = os.path.join(second, shard)
    os.truncate(shard2, os.path.getsize(shard2) - 10)
    assert not ck.verify(newest).ok and not ck.verify(second).ok

    # Resume the same run with ONE worker: replicated state loads with another world size.
    again = _trainer(tmp_path, "run", steps=6, workers=1).fit()
    assert again.metrics["start"] == 3 and again.metrics["world"] == 1
    events = read_events(again.path)
    rejected = [e for e in events if e["kind"] == "checkpoint_rejected"]
    assert {os.path.basename(e["path"]) for e in rejected} == {os.path.basename(newest),
                                                               os.path.basename(second)}
    assert any(shard in e["detail"] for e in rejected)
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored[-1]["step"] == 2 and third.endswith(os.path.basename(restored[-1]["path"]))
    # The rayguard CLI agrees.
    cli = run_cli(["checkpoint", "verify", newest])
    assert cli.rc == 1 and cli.stdout.startswith("CORRUPT"), cli.stdout + cli.stderr


def test_a_kill_mid_commit_then_a_full_disk_leave_nothing_half_written(ray_local, tmp_path):
    """Attempt 0: rank 0 killed while step 3's checkpoint commits (its manifest written, not
    yet published): attempt 1 resumes from step 2. Attempt 1: the disk is full at step 4's
    checkpoint, and with no restart left the run ends with the reason, the earlier
    checkpoints kept and verified. (These were two fits, the kill and the full disk.)"""
    trainer = _trainer(tmp_path, "killed", steps=6, kill_in_commit_at=3, fill_disk_at=[[1, 4]],
                       restarts=1)
    with pytest.raises(Exception) as err:
        trainer.fit()
    text = str(err.value)
    assert "No space left on device" in text and "checkpoint of step 4 was not saved" in text
    run_dir = os.path.join(tmp_path, "killed")
    events = read_events(run_dir)
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored and restored[0]["step"] == 2  # step 3 was never committed in attempt 0
    names = _committed(run_dir)
    assert [n.split("_", 1)[1] for n in names] == [
        "000000000_a0", "000000001_a0", "000000002_a0", "000000003_a1"], names
    assert all(ck.verify(os.path.join(run_dir, n)).ok for n in names)
    assert not [p for p in os.listdir(run_dir) if p.startswith(".rayguard-staging-")]
    assert [e for e in events if e["kind"] == "failed"]
