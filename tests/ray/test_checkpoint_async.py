"""Asynchronous checkpoints (CheckpointConfig(mode="async")) in RobustTrainer runs on a real
local cluster: the same files as a synchronous run, a background disk-full raised at the next
report with the previous checkpoint kept, and a worker killed while a checkpoint persists in
the background."""

from __future__ import annotations

import errno
import os
import signal

import pytest
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard import checkpoint as ck
from rayguard.events import read as read_events


def loop(config):
    import rayguard.checkpoint.fsio as fsio

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.load_state_dict(state["model"])
    for step in range(start, config["steps"]):
        with torch.no_grad():
            model.weight.add_(0.01)
        x = torch.randn(4)  # the RNG state is saved with each checkpoint
        if ctx.rank == 0 and [ctx.attempt, step] in config.get("fill_disk_at", []):
            full = f"checkpoint_{step:09d}"

            def full_once(path, offset, nbytes, full=full):  # this step's background write fails
                if full in path:
                    fsio.set_write_fault_hook(None)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            fsio.set_write_fault_hook(full_once)
        if ctx.rank == 0 and [ctx.attempt, step] == config.get("kill_persisting_at"):
            name = f"checkpoint_{step:09d}"

            def die_in_background(phase, path, name=name):  # the loop has moved on by now
                if phase == "shard-written" and name in path:
                    os.kill(os.getpid(), signal.SIGKILL)
            fsio.set_phase_hook(die_in_background)
        rayguard.train.report({"loss": float(x.sum()), "step": step, "start": start},
                              state={"model": model.state_dict(), "step": step}
                              if ctx.rank == 0 else None)


def _fit(tmp_path, name, mode, steps=4, restarts=3, **config):
    trainer = rayguard.RobustTrainer(
        loop, train_loop_config={"steps": steps, **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name=name),
        guard_config=rayguard.GuardConfig(
            numa="off", checkpoint=rayguard.CheckpointConfig(mode=mode),
            health=rayguard.HealthConfig(max_restarts=restarts)))
    return trainer.fit()


def _committed(run_dir):
    return sorted(p for p in os.listdir(run_dir)
                  if p.startswith("checkpoint_") and os.path.isdir(os.path.join(run_dir, p)))


def test_async_checkpoints_are_the_files_a_sync_run_writes(ray_local_module, tmp_path):
    sync = _fit(tmp_path, "sync", "sync")
    run = _fit(tmp_path, "async", "async")
    names = _committed(run.path)
    assert names == _committed(sync.path) == [f"checkpoint_{s:09d}_a0" for s in range(4)]
    assert run.checkpoint.path.endswith(names[-1])  # fit() returned after the last commit
    for name in names:
        a, s = ck.read_manifest(os.path.join(run.path, name)), ck.read_manifest(
            os.path.join(sync.path, name))
        assert ck.verify(os.path.join(run.path, name)).ok
        assert (a.world_size, a.step, a.metadata) == (s.world_size, s.step, s.metadata)
        # same bytes: state and the RNG state captured at the same step
        assert [(f.path, f.size_bytes, f.digest) for f in a.files] == [
            (f.path, f.size_bytes, f.digest) for f in s.files]
    committed = [e for e in read_events(run.path) if e["kind"] == "checkpoint_committed"]
    assert [e["step"] for e in committed] == [0, 1, 2, 3]
    assert all(e["mode"] == "async" and e["backpressure_s"] >= 0 and "snapshot_s" in e
               for e in committed)
    assert not [e for e in read_events(sync.path)
                if e["kind"] == "checkpoint_committed" and "mode" in e]


def test_disk_full_kill_then_disk_full_each_restart_from_the_previous_then_end_the_run(
        ray_local_module, tmp_path):
    """Attempt 0: step 3's background write finds the disk full; attempt 1 resumes from step
    2, and rank 0 is killed while step 4's checkpoint persists; attempt 2 resumes from step 3
    (step 4 never committed), and step 5's background write finds the disk full again: no
    restart is left, so it is raised at the next report and ends the run with the previous
    checkpoints kept. Nothing half-written is left. (These were two fits: the disk full
    without a restart, and the disk full then the kill.)"""
    with pytest.raises(Exception) as err:
        _fit(tmp_path, "full-killed", "async", steps=7, restarts=2,
             fill_disk_at=[[0, 3], [2, 5]], kill_persisting_at=[1, 4])
    text = str(err.value)
    assert "No space left on device" in text and "checkpoint of step 5 was not saved" in text
    run_dir = os.path.join(tmp_path, "full-killed")
    events = read_events(run_dir)
    restored = sorted({(e["attempt"], e["step"]) for e in events if e["kind"] == "restored"})
    assert restored == [(1, 2), (2, 3)], restored
    names = _committed(run_dir)
    assert names == ["checkpoint_000000000_a0", "checkpoint_000000001_a0",
                     "checkpoint_000000002_a0", "checkpoint_000000003_a1",
                     "checkpoint_000000004_a2"], names  # never step 3 of a0 nor 4 of a1
    assert all(ck.verify(os.path.join(run_dir, n)).ok for n in names)
    assert not [p for p in os.listdir(run_dir) if p.startswith(".rayguard-staging-")]
    assert [e for e in events if e["kind"] == "failed"]
