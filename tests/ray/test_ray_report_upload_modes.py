"""Ranks may report the same ``ray.train.report`` with different upload modes, or one with a
checkpoint and another without, as under Ray's TorchTrainer: the run finishes, every
checkpoint is sealed and verifies, and ``ray.train.get_checkpoint()`` then answers as Ray's
does: the newest checkpoint this rank reported (verified choices at a resume are tested with
restarts in test_ray_report_loops.py). One real run on the shared
local cluster, 2 workers."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle

import rayguard
from rayguard.testing.recorder import make_trainer

_spec = importlib.util.spec_from_file_location(
    "frameworks_common", Path(__file__).with_name("frameworks_common.py"))
common = sys.modules.setdefault("frameworks_common", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(common)
cloudpickle.register_pickle_by_value(common)  # workers cannot import tests/

# Every unordered pair of {ASYNC, SYNC, NO_UPLOAD, no checkpoint}, one per iteration, as
# (rank 0's mode, rank 1's mode); None: no checkpoint (Ray's own test walks the same ten).
PAIRS = (("ASYNC", "ASYNC"), ("ASYNC", "SYNC"), ("ASYNC", "NO_UPLOAD"), ("ASYNC", None),
         ("SYNC", "SYNC"), ("SYNC", "NO_UPLOAD"), ("SYNC", None),
         ("NO_UPLOAD", "NO_UPLOAD"), ("NO_UPLOAD", None), (None, None))
LAST_SEALED = max(i for i, pair in enumerate(PAIRS) if pair != (None, None))


def mixed_modes_loop(config):
    """Iteration ``i`` reports with ``PAIRS[i]``; then every rank reads the checkpoint
    ``get_checkpoint()`` answers and writes down which it was."""
    import ray.train
    from ray.train import Checkpoint

    ctx = ray.train.get_context()
    rank, storage = ctx.get_world_rank(), ctx.get_storage()
    for i in range(len(PAIRS)):
        mode = PAIRS[i][rank]
        metrics = {"step": i, "rank": rank}
        if mode is None:
            ray.train.report(metrics)
            continue
        name = f"checkpoint_iteration_{i}"
        if mode == "NO_UPLOAD":  # already where Ray keeps it
            directory = storage.build_checkpoint_path_from_name(name)
        else:  # a local directory that lives through an ASYNC upload
            directory = os.path.join(config["local_dir"], name, f"_{rank}")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"shard_{rank}"), "w") as f:
            f.write(f"iteration {i} rank {rank}")
        ray.train.report(metrics, checkpoint=Checkpoint(directory), checkpoint_dir_name=name,
                         checkpoint_upload_mode=getattr(ray.train.CheckpointUploadMode, mode))
    chosen = ray.train.get_checkpoint()
    i = int(chosen.path.rsplit("_", 1)[1])
    for r, r_mode in enumerate(PAIRS[i]):
        if r_mode is not None:
            with open(os.path.join(chosen.path, f"shard_{r}")) as f:
                assert f.read() == f"iteration {i} rank {r}", (chosen.path, r)
    with open(os.path.join(config["local_dir"], f"chosen_{rank}"), "w") as f:
        f.write(str(i))


@pytest.mark.timeout(300)  # a deadlock fails here, not at the Ray tests' 15 minutes
def test_ranks_mixing_upload_modes_at_one_report_finish_sealed(ray_local, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    run_dir = tmp_path / "mixed"
    trainer = make_trainer(mixed_modes_loop, tmp_path, name="mixed",
                           config={"local_dir": str(local)})
    result = trainer.fit()
    common.assert_clean(result, trainer.run_dir)
    events = common.events(trainer.run_dir)
    committed = sorted(e["step"] for e in events if e["kind"] == "checkpoint_committed")
    assert committed == list(range(LAST_SEALED + 1)), committed
    for i, pair in enumerate(PAIRS):
        path = run_dir / f"checkpoint_iteration_{i}"
        if pair == (None, None):
            assert not path.exists()
            continue
        report = rayguard.checkpoint.verify(str(path))
        assert report.ok and report.manifest.step == i, report.describe()
        shards = sorted(f.path for f in report.manifest.files)
        assert shards == [f"shard_{r}" for r, mode in enumerate(pair) if mode], (i, shards)
    assert result.checkpoint.path.endswith(f"checkpoint_iteration_{LAST_SEALED}")
    # as with TorchTrainer: each rank's own newest report (rank 1 reported none at 8), not a
    # resume's verified choice
    newest = [max(i for i, pair in enumerate(PAIRS) if pair[r]) for r in (0, 1)]
    assert [int((local / f"chosen_{r}").read_text()) for r in (0, 1)] == newest == [8, 7]
    assert not [e for e in events if e["kind"] == "restored"]
    assert trainer.last_metrics["step"] == len(PAIRS) - 1
