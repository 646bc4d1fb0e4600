"""Test helpers for runs: record what Ray Train's controller saw, build small trainers."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import ray.train
from ray.train import Checkpoint, UserCallback
from ray.train.v2.api.config import RunConfig, ScalingConfig

from rayguard.config import GuardConfig
from rayguard.trainer import RobustTrainer


class RecordReports(UserCallback):
    """Appends every metrics dict Ray Train's controller sees to a JSONL file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")


def read_reports(path: str) -> list[list[dict[str, Any]]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def report_json(metrics: dict[str, Any], state: dict[str, Any] | None = None) -> None:
    """``ray.train.report(metrics)`` as Ray's docs write a loop's report; with ``state``, a
    checkpoint of it as ``state.json`` (read back by :func:`json_checkpoint`)."""
    if state is None:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump(state, f)
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))


def json_checkpoint(checkpoint: Any) -> dict[str, Any] | None:
    """The state :func:`report_json` saved in ``checkpoint`` (``None``: no checkpoint)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        return json.load(f)


def make_trainer(fn, tmp_path, *, num_workers: int = 2, config: dict | None = None,
                 guard: GuardConfig | None = None, callbacks=None, name: str = "run",
                 **run_kwargs) -> RobustTrainer:
    return RobustTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(storage_path=str(tmp_path), name=name, callbacks=callbacks,
                             **run_kwargs),
        guard_config=guard or GuardConfig(),
    )
