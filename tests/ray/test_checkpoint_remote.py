"""Verified checkpoints on a remote pyarrow filesystem (RunConfig(storage_filesystem=...)).

The filesystem is a pyarrow SubTreeFileSystem over a local folder: not a LocalFileSystem,
so rayguard takes its remote path (local staging, upload, manifest written last, download
and verify before use) while the test can still corrupt bytes "in the bucket"."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events


def remote_loop(config):
    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.load_state_dict(state["model"])
    for step in range(start, config["steps"]):
        with torch.no_grad():
            model.weight.add_(1.0)
        rayguard.train.report({"loss": 1.0, "step": step, "start": start,
                               "w": float(model.weight[0, 0])},
                              state={"model": model.state_dict(), "step": step}
                              if ctx.rank == 0 else None)


def _fit(fs, steps, faults=None):
    return rayguard.RobustTrainer(
        remote_loop, train_loop_config={"steps": steps},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path="runs", storage_filesystem=fs, name="remote"),
        guard_config=rayguard.GuardConfig(numa="off", faults=faults)).fit()


def test_remote_storage_commits_recovers_and_falls_back(ray_local, tmp_path):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    fs = pafs.SubTreeFileSystem(str(bucket), pafs.LocalFileSystem())
    result = _fit(fs, steps=5, faults="kill:rank=1,step=3")
    events = read_events(result.path, result.filesystem)
    kinds = [e["kind"] for e in events]
    assert "worker_died" in kinds and kinds[-1] == "finished"
    assert [e["step"] for e in events if e["kind"] == "restored"] == [2]
    first_w = result.metrics["w"]
    run = bucket / "runs" / "remote"
    names = sorted(p for p in os.listdir(run) if p.startswith("checkpoint_") and (run / p).is_dir())
    assert all((run / n / "rayguard_manifest.json").exists() for n in names)
    assert not any(p.startswith(".rayguard-staging") for p in os.listdir(run))

    # Bit-rot in the bucket: the newest checkpoint fails verification after download.
    newest = run / names[-1]
    shard = next(p for p in os.listdir(newest) if p.endswith(".safetensors"))
    with open(newest / shard, "r+b") as f:
        f.seek(150)
        b = f.read(1)
        f.seek(150)
        f.write(bytes([b[0] ^ 0xFF]))
    again = _fit(fs, steps=6)
    events = read_events(again.path, again.filesystem)
    rejected = [e for e in events if e["kind"] == "checkpoint_rejected"]
    assert rejected and names[-1] in rejected[0]["path"] and "blake3" in rejected[0]["detail"]
    assert again.metrics["start"] == 4  # resumed after step 3, the newest that verifies
    assert again.metrics["w"] == first_w + 1.0  # steps 4 and 5 on top of step 3's weights
