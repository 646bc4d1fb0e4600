"""Verified checkpoints on a remote pyarrow filesystem (RunConfig(storage_filesystem=...)),
plain state and sharded state in the same checkpoints.

The filesystem is a pyarrow SubTreeFileSystem over a local folder: not a LocalFileSystem,
so rayguard takes its remote path while the test can still corrupt bytes "in the bucket".
Plain state (``state=``): local staging, upload, manifest written last, download and verify
before use. Sharded state (FSDP2, ``sharded=``): each rank stages DCP locally and uploads, rank
0 writes the manifest last; on load each rank downloads and verifies its whole copy before
DCP reads it. (These were two files of two fits each, one per kind of state.)"""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.forge import flip_byte

pytestmark = pytest.mark.timeout(900)


def remote_loop(config):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    plain = torch.nn.Linear(16, 16)  # the same on every rank: plain state=
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (ctx.world_size,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sharded = {"model": model, "optim": opt}
    state = rayguard.train.load_state(sharded=sharded)
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        plain.load_state_dict(state["plain"])
    for step in range(start, config["steps"]):
        with torch.no_grad():
            plain.weight.add_(1.0)
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        rayguard.train.report({"loss": 1.0, "step": step, "start": start,
                               "w": float(plain.weight[0, 0])},
                              sharded=sharded, state={"plain": plain.state_dict(), "step": step})


def _fit(fs, steps, faults=None):
    return rayguard.RobustTrainer(
        remote_loop, train_loop_config={"steps": steps},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path="runs", storage_filesystem=fs, name="remote"),
        guard_config=rayguard.GuardConfig(seed=0, numa="off", faults=faults)).fit()


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
    assert len(names) == 5, names  # steps 0..4
    for n in names:
        assert (run / n / "rayguard_manifest.json").exists()
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(run / n / "dcp"))
    assert not any(p.startswith(".rayguard-staging") for p in os.listdir(run))

    # Bit-rot in the bucket: a DCP shard of the newest checkpoint, a plain state shard of the
    # one before; each fails verification after download.
    newest, before = run / names[-1], run / names[-2]
    flip_byte(newest / "dcp" / "__1_0.distcp")
    flip_byte(before / next(p for p in os.listdir(before) if p.endswith(".safetensors")), 150)
    again = _fit(fs, steps=6)
    events = read_events(again.path, again.filesystem)
    rejected = [e for e in events if e["kind"] == "checkpoint_rejected"]
    assert len(rejected) == 2, rejected
    assert names[-1] in rejected[0]["path"]
    assert "dcp/__1_0.distcp: blake3 mismatch" in rejected[0]["detail"]
    assert names[-2] in rejected[1]["path"] and "blake3" in rejected[1]["detail"]
    assert again.metrics["start"] == 3  # resumed after step 2, the newest that verifies
    assert again.metrics["w"] == first_w + 1.0  # steps 3 to 5 on top of step 2's weights
