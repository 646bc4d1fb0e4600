"""A loop written for Ray Train (``ray.train.report(metrics, checkpoint=...)``, resume from
``ray.train.get_checkpoint()``) is guarded under RobustTrainer with no change: progress,
NaN, verified checkpoints, crash loops. Real runs on the shared local cluster, 2 workers."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle
import torch
from ray.train import Checkpoint
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer

_spec = importlib.util.spec_from_file_location(
    "frameworks_common", Path(__file__).with_name("frameworks_common.py"))
common = sys.modules.setdefault("frameworks_common", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(common)
cloudpickle.register_pickle_by_value(common)  # workers cannot import tests/

STEPS = 12


def _once(marker_dir: str, name: str) -> bool:
    """True the first time it is called for ``name`` (a marker file makes it once per test)."""
    path = os.path.join(marker_dir, name)
    if os.path.exists(path):
        return False
    with open(path, "w"):
        pass
    return True


def _kill_once_registered(run_dir: str, checkpoints: int) -> str:
    """Wait until rank 0 persisted ``checkpoints`` checkpoints and Ray's controller registered
    the newest (a report still queued in a killed process is lost, by Ray's design); returns
    its path. The caller then kills this process."""
    deadline = time.monotonic() + 120
    while len(common.checkpoint_dirs(run_dir)) < checkpoints and time.monotonic() < deadline:
        time.sleep(0.05)
    return common.wait_registered(run_dir)


def ray_loop(config):
    """As Ray's docs write it: rank 0 saves and reports a checkpoint every 2 steps; every
    rank resumes from ray.train.get_checkpoint()."""
    import ray.train

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    weights = torch.zeros(4)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = torch.load(os.path.join(d, "model.pt"))
            weights, start = saved["weights"], saved["step"] + 1
        with open(os.path.join(config["marker_dir"], f"resumed-{rank}-{start}"), "w"):
            pass
    with open(os.path.join(config["marker_dir"], f"entered-{rank}"), "a") as f:
        f.write(f"{os.getpid()} {start}\n")  # the function may run twice in one process
    for step in range(start, STEPS):
        time.sleep(config.get("sleep_s", 0.0))
        weights = weights + step * 0.5  # the same update on every rank, from the step alone
        loss = float("nan") if (config.get("nan_at") == step and rank == 0
                                and _once(config["marker_dir"], "nan")) else 1.0 / (step + 1)
        if config.get("kill_at") == step and rank == 1 and _once(config["marker_dir"], "kill"):
            # Ray registers a checkpoint when its controller polls the reports: kill only
            # once it has the newest one (a report queued in a killed process is lost)
            newest = _kill_once_registered(config["run_dir"], step // 2)
            damaged = newest
            if config.get("unseal_newest"):  # unseal the newest: no manifest, another state
                os.unlink(os.path.join(newest, "rayguard_manifest.json"))
                torch.save({"weights": torch.full((4,), 999.0), "step": step - 1},
                           os.path.join(newest, "model.pt"))
                damaged = [d for d in common.checkpoint_dirs(config["run_dir"]) if d != newest][-1]
            if config.get("corrupt"):  # damage a persisted checkpoint first
                with open(os.path.join(damaged, "model.pt"), "r+b") as f:
                    f.truncate(10)
            os.kill(os.getpid(), signal.SIGKILL)
        metrics = {"loss": loss, "step": step}
        if step % 2 == 1 and rank == 0 and config.get("async_upload"):
            d = tempfile.mkdtemp()  # Ray deletes it once uploaded
            torch.save({"weights": weights, "step": step}, os.path.join(d, "model.pt"))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d),
                             checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC)
        elif step % 2 == 1 and rank == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"weights": weights, "step": step}, os.path.join(d, "model.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)
    with open(os.path.join(config["marker_dir"], f"final-{rank}.json"), "w") as f:
        json.dump(weights.tolist(), f)


def expected_weights() -> list[float]:
    w = torch.zeros(4)
    for step in range(STEPS):
        w = w + step * 0.5
    return w.tolist()


def _run(tmp_path, name, guard=None, checkpoint_config=None, **config):
    """A trainer of :func:`ray_loop` (``config`` its loop's, ``checkpoint_config`` Ray's
    ``RunConfig`` one) and the loop's marker folder."""
    marker = tmp_path / f"{name}-markers"
    marker.mkdir()
    trainer = make_trainer(ray_loop, tmp_path, name=name, guard=guard,
                           config={"marker_dir": str(marker), "run_dir": str(tmp_path / name),
                                   **config}, checkpoint_config=checkpoint_config)
    return trainer, marker


def _kinds(run_dir):
    return [e["kind"] for e in read_events(run_dir)]


def _final(marker):
    return [json.loads((marker / f"final-{r}.json").read_text()) for r in range(2)]


@pytest.mark.compat  # the report seam is a Ray internal: checked on the oldest Ray too
def test_a_healthy_ray_report_loop_longer_than_both_bounds_keeps_rays_upload_and_keep(
        ray_local, tmp_path):
    """A healthy loop whose run outlasts both bounds is never killed; its checkpoints, uploaded
    asynchronously (``CheckpointUploadMode.ASYNC``), each carry rayguard's manifest, and Ray's
    ``CheckpointConfig`` (two kept, by lowest loss) stays Ray's (these were two fits)."""
    from ray.train import CheckpointConfig

    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(startup_timeout_s=4,
                                                              stall_timeout_s=4))
    keep2 = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                             checkpoint_score_order="min")
    trainer, marker = _run(tmp_path, "healthy", guard, checkpoint_config=keep2,
                           async_upload=True, sleep_s=0.6)  # ~7 s of steps
    result = trainer.fit()
    kinds = _kinds(trainer.run_dir)
    assert result.error is None
    assert "stall_detected" not in kinds and "restart" not in kinds, kinds
    assert trainer.last_metrics["step"] == STEPS - 1
    assert _final(marker) == [expected_weights()] * 2
    committed = [e for e in read_events(trainer.run_dir) if e["kind"] == "checkpoint_committed"]
    assert [e["step"] for e in committed] == [1, 3, 5, 7, 9, 11]
    assert all(e.get("source") == "ray.train.report" for e in committed)
    kept = sorted(p for p in os.listdir(trainer.run_dir)
                  if p.startswith("checkpoint_") and os.path.isdir(os.path.join(trainer.run_dir, p)))
    assert len(kept) == 2 and len(result.best_checkpoints) == 2
    for checkpoint, metrics in result.best_checkpoints:  # the two lowest losses: steps 9, 11
        assert metrics["step"] in (9, 11)
        report = rayguard.checkpoint.verify(checkpoint.path)
        assert report.ok and report.manifest.step == metrics["step"], report.describe()
    report = rayguard.checkpoint.verify(result.checkpoint.path)
    assert report.ok and report.manifest.step == 11, report.describe()


@pytest.mark.compat  # the report seam is a Ray internal: checked on the oldest Ray too
def test_a_damaged_newest_checkpoint_is_skipped_then_a_nan_restarts_the_group(ray_local,
                                                                              tmp_path):
    """Two whole-group restarts (``recovery="restart"``), each resumed through
    ``ray.train.get_checkpoint()``. Attempt 0: the newest checkpoint (step 5) unsealed by
    someone who can write the storage (its manifest removed, its state rewritten) and the one
    before (step 3) truncated, then rank 1 killed: both are rejected, attempt 1 resumes from
    step 1's. Attempt 1: a NaN loss at step 8 on rank 0: the group restarts and attempt 2
    resumes from step 7's, the newest verified. The run ends with the weights of a run
    without faults (these were two fits: the damaged checkpoints and the NaN restart)."""
    trainer, marker = _run(tmp_path, "corrupt", rayguard.GuardConfig(recovery="restart"),
                           kill_at=6, corrupt=True, unseal_newest=True, nan_at=8)
    result = trainer.fit()
    assert result.error is None
    events = read_events(trainer.run_dir)
    rejected = [e for e in events if e["kind"] == "checkpoint_rejected"]
    assert len(rejected) == 2 and "model.pt" in rejected[1]["detail"], rejected
    assert "no rayguard manifest" in rejected[0]["detail"], rejected
    assert "checkpoint_committed" in rejected[0]["detail"], rejected
    assert (marker / "resumed-0-2").exists() and (marker / "resumed-1-2").exists()
    assert not (marker / "resumed-0-6").exists() and not (marker / "resumed-0-4").exists()
    on_disk = json.loads((tmp_path / "corrupt" / "rayguard_rejected.json").read_text())
    assert sorted(on_disk) == sorted(os.path.basename(e["path"]) for e in rejected)
    # the NaN: detected at step 8 in attempt 1, the group restarted, rolled back to step 7's
    detected = [(e["attempt"], e["step"]) for e in events if e["kind"] == "nan_detected"]
    assert detected == [(1, 8)], detected
    died = [(e["attempt"], e["failure"]) for e in events if e["kind"] == "worker_died"]
    assert (1, "nan") in died, died
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [e["attempt"] for e in restarts] == [0, 1], restarts
    assert all(e.get("path") is None for e in restarts), restarts  # whole-group restarts
    assert (marker / "resumed-0-8").exists() and (marker / "resumed-1-8").exists()
    assert _final(marker) == [expected_weights()] * 2


def test_a_nan_with_policy_fail_ends_the_run_with_rayguards_message(ray_local, tmp_path):
    guard = rayguard.GuardConfig(health=rayguard.HealthConfig(nan_policy="fail"))
    trainer, _ = _run(tmp_path, "nanfail", guard, nan_at=4)
    with pytest.raises(WorkerGroupError, match="metric 'loss' is nan at step 4"):
        trainer.fit()
    assert "restart" not in _kinds(trainer.run_dir)


def unloadable_loop(config):
    """The newest checkpoint verifies but the loop cannot load it (written in a format the
    loop no longer reads): after the crash-loop repeat it is rejected, the older one used."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                saved = json.load(f)
            if saved.get("format") != 1:
                raise ValueError("unknown checkpoint format")
            start = saved["step"] + 1
        with open(os.path.join(config["marker_dir"], f"resumed-{rank}-{start}"), "w"):
            pass
    for step in range(start, 6):
        metrics = {"loss": 1.0, "step": step}
        if rank == 0 and step in (1, 3):
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step, "format": 1 if step == 1 else 2}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)
        if step == 4 and rank == 1 and _once(config["marker_dir"], "kill"):
            _kill_once_registered(config["run_dir"], 2)  # the step-3 checkpoint is Ray's latest
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_verified_checkpoint_the_loop_cannot_load_is_rejected_after_the_repeat(ray_local,
                                                                                 tmp_path):
    marker = tmp_path / "markers"
    marker.mkdir()
    trainer = make_trainer(unloadable_loop, tmp_path, name="unloadable",
                           config={"marker_dir": str(marker),
                                   "run_dir": str(tmp_path / "unloadable")})
    result = trainer.fit()
    assert result.error is None
    events = read_events(trainer.run_dir)
    rejected = [e for e in events if e["kind"] == "checkpoint_rejected"]
    assert len(rejected) == 1 and "cannot load it" in rejected[0]["detail"], rejected
    assert (marker / "resumed-0-2").exists()  # the step-1 checkpoint, after the step-3 one
    assert "crash_loop" not in [e["kind"] for e in events]


def mixed_loop(config):
    """rayguard.train.report(state=) for exact resume beside a framework-style
    ray.train.report(checkpoint=) on every rank."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    for step in range(start, 8):
        rayguard.train.report({"loss": 1.0, "step": step},
                              state={"step": step} if step % 3 == 2 else None)
        if step % 2 == 1:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    with open(os.path.join(d, "weights.txt"), "w") as f:
                        f.write(str(step))
                ray.train.report({"loss": 1.0, "step": step},
                                 checkpoint=Checkpoint.from_directory(d))
        if torch.distributed.is_initialized():
            torch.distributed.barrier()


def test_mixing_rayguard_and_ray_reports_runs_to_the_end(ray_local, tmp_path):
    trainer = make_trainer(mixed_loop, tmp_path, name="mixed")
    result = trainer.fit()
    assert result.error is None
    events = read_events(trainer.run_dir)
    committed = [e for e in events if e["kind"] == "checkpoint_committed"]
    sources = sorted((e.get("source") or "rayguard", e["step"]) for e in committed)
    assert sources == [("ray.train.report", 1), ("ray.train.report", 3),
                       ("ray.train.report", 5), ("ray.train.report", 7),
                       ("rayguard", 2), ("rayguard", 5)], sources
    assert trainer.last_metrics["step"] == 7


def test_a_killed_worker_is_replaced_live_then_a_nan_rolls_back_in_place_from_signed_checkpoints(
        ray_local, tmp_path):
    """GuardConfig(recovery="live", the default), with a checkpoint key: every sealed
    manifest is signed, and each resume checks it (these were two fits: the kill and the NaN).
    Attempt 0: rank 1 killed at step 6 is replaced alone; rank 0 keeps its process and
    re-enters the loop, where ray.train.get_checkpoint() answers the run's last commit (step
    5). Attempt 1: a NaN loss at step 8 on rank 0: every rank agrees at the NaN's report and
    re-enters the loop in its own process, offered rank 0's last reported checkpoint (step 7;
    rank 1 never reported one), verified again; Ray never restarts. Both ranks end with the
    weights of a run without the faults."""
    key = tmp_path / "checkpoint.key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    guard = rayguard.GuardConfig(recovery="live",
                                 checkpoint=rayguard.CheckpointConfig(key_file=str(key)))
    trainer, marker = _run(tmp_path, "live", guard, kill_at=6, nan_at=8)
    result = trainer.fit()
    assert result.error is None
    assert _final(marker) == [expected_weights()] * 2
    entries = {rank: [line.split() for line in
                      (marker / f"entered-{rank}").read_text().split("\n") if line]
               for rank in (0, 1)}
    for rank in (0, 1):
        assert [start for _, start in entries[rank]] == ["0", "6", "8"], entries
    assert len({pid for pid, _ in entries[0]}) == 1, entries  # rank 0: one process throughout
    # rank 1: replaced after the kill, the replacement kept through the NaN's rollback
    assert entries[1][0][0] != entries[1][1][0] == entries[1][2][0], entries
    events = read_events(trainer.run_dir)
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [(e["attempt"], e["path"]) for e in restarts] == [(0, "live"), (1, "in_place")]
    assert restarts[1]["step"] == 8, restarts
    assert [e["rank"] for e in events if e["kind"] == "worker_died"] == [1]  # not the NaN
    assert [e["path"] for e in events if e["kind"] == "nan_detected"] == ["in_place"]
    sealed = [json.loads((Path(d) / "rayguard_manifest.json").read_text())
              for d in common.checkpoint_dirs(trainer.run_dir)]
    assert sealed and all(doc["auth"]["mac"] == "blake3-keyed" for doc in sealed)
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored and all(e["verified"] is True for e in restored), restored
    offered = [e for e in restored if e["attempt"] == 2]
    assert len(offered) == 1 and offered[0]["step"] == 7, offered
