"""Sharded state on a remote pyarrow filesystem (a SubTreeFileSystem over a local folder, so
rayguard takes its remote path): each rank stages DCP locally and uploads, rank 0 writes the
manifest last; on load each rank downloads and verifies its whole copy before DCP reads it."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events

pytestmark = pytest.mark.timeout(900)


def remote_loop(config):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (ctx.world_size,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sharded = {"model": model, "optim": opt}
    state = rayguard.train.load_state(sharded=sharded)
    start = 0 if state is None else state["step"] + 1
    for step in range(start, config["steps"]):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        rayguard.train.report({"step": step, "start": start}, sharded=sharded, state={"step": step})
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if ctx.rank == 0:
        torch.save(full, config["out"])


def _fit(fs, tmp_path, steps, faults=None):
    out = str(tmp_path / f"out-{steps}-{faults}.pt")
    result = rayguard.RobustTrainer(
        remote_loop, train_loop_config={"steps": steps, "out": out},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path="runs", storage_filesystem=fs, name="remote"),
        guard_config=rayguard.GuardConfig(seed=0, numa="off", faults=faults)).fit()
    return result, torch.load(out, weights_only=True)


def test_sharded_remote_commits_recovers_and_falls_back(ray_local, tmp_path):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    fs = pafs.SubTreeFileSystem(str(bucket), pafs.LocalFileSystem())
    result, _ = _fit(fs, tmp_path, steps=5, faults="kill:rank=1,step=3")
    events = read_events(result.path, result.filesystem)
    kinds = [e["kind"] for e in events]
    assert "worker_died" in kinds and kinds[-1] == "finished"
    assert [e["step"] for e in events if e["kind"] == "restored"] == [2]
    run = bucket / "runs" / "remote"
    names = sorted(p for p in os.listdir(run) if p.startswith("checkpoint_") and (run / p).is_dir())
    for n in names:
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(run / n / "dcp"))
    # Bit-rot in the bucket: a DCP shard of the newest checkpoint.
    newest = run / names[-1] / "dcp" / "__1_0.distcp"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    again, _ = _fit(fs, tmp_path, steps=5)
    events = read_events(again.path, again.filesystem)
    rejected = [e for e in events if e["kind"] == "checkpoint_rejected"]
    assert rejected and names[-1] in rejected[0]["path"]
    assert "dcp/__1_0.distcp: blake3 mismatch" in rejected[0]["detail"]
    assert again.metrics["start"] == 4  # resumed after step 3, the newest that verifies
