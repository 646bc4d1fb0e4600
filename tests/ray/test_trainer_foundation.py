"""RobustTrainer on a real local Ray cluster: set-up, context, seeding, report ordering."""

from __future__ import annotations

import json

import pytest
from ray.train import FailureConfig, RunConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import RecordReports, make_trainer, read_reports
from rayguard.train.seeding import rank_seed


def _loop(config):
    import random

    import numpy as np
    import ray.train
    import torch

    ctx = rayguard.train.get_context()
    draws = [random.random(), float(np.random.rand()), float(torch.rand(1))]
    try:  # no datasets were given: Ray's own error, with no DatasetManager actor behind it
        ray.train.get_dataset_shard("train")
        shard_error = None
    except KeyError as exc:
        shard_error = str(exc)
    with open(f"{config['out']}/rank{ctx.rank}.json", "w") as f:
        json.dump({"rank": ctx.rank, "local_rank": ctx.local_rank, "world": ctx.world_size,
                   "seed": ctx.seed, "attempt": ctx.attempt, "device": str(ctx.device),
                   "draws": draws, "lr": config["lr"], "run_dir": ctx.run_dir,
                   "shard_error": shard_error}, f)
    for step in range(config["steps"]):
        rayguard.train.report({"loss": 1.0 / (step + 1), "step": step, "rank": ctx.rank})


def _run(tmp_path, name, steps=20, seed=0):
    out = tmp_path / f"out-{name}"
    out.mkdir()
    log = str(tmp_path / f"{name}-reports.jsonl")
    trainer = make_trainer(_loop, tmp_path, config={"out": str(out), "steps": steps, "lr": 0.1},
                           guard=rayguard.GuardConfig(seed=seed), callbacks=[RecordReports(log)],
                           name=name)
    result = trainer.fit()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return result, ranks, read_reports(log)


def test_context_seeding_and_every_report_in_order(ray_local, tmp_path):
    result, ranks, reports = _run(tmp_path, "a")
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world"] == 2 and r["attempt"] == 0 and r["device"] == "cpu" for r in ranks)
    assert all(r["lr"] == 0.1 for r in ranks)  # train_loop_config reaches the user function
    assert ranks[0]["seed"] != ranks[1]["seed"]
    assert ranks[0]["draws"] != ranks[1]["draws"]  # distinct per rank
    assert ranks[0]["run_dir"] == result.path
    assert all("Dataset shard for 'train' not found" in r["shard_error"] for r in ranks), ranks
    # Ray's callbacks saw all 20 reports of both ranks, in order, none lost or duplicated.
    assert [[m["step"] for m in per_rank] for per_rank in reports] == [[s, s] for s in range(20)]
    assert all([m["rank"] for m in per_rank] == [0, 1] for per_rank in reports)
    kinds = [e["kind"] for e in read_events(result.path)]
    assert kinds[0] == "start" and "attempt_started" in kinds and kinds[-1] == "finished"

    # Each rank's loop starts with the RNGs of its own seed and nothing drawn from them: the
    # same seed gives the same draws in any run, another seed others.
    for r in ranks:
        assert r["seed"] == rank_seed(0, r["rank"])
        assert r["draws"] == _draws(r["seed"]) != _draws(rank_seed(1, r["rank"]))


def _draws(seed: int) -> list[float]:
    """What the loop draws first after ``seed_everything(seed)`` (without touching this
    process's own RNGs)."""
    import random

    import numpy as np
    import torch

    return [random.Random(seed).random(), float(np.random.RandomState(seed).rand()),
            float(torch.rand(1, generator=torch.Generator().manual_seed(seed)))]


def test_default_restart_budget_and_explicit_failure_config_respected(tmp_path):
    t = make_trainer(_loop, tmp_path, guard=rayguard.GuardConfig(
        health=rayguard.HealthConfig(max_restarts=5)))
    assert t.run_config.failure_config.max_failures == 5
    t2 = rayguard.RobustTrainer(_loop, run_config=RunConfig(
        storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)))
    assert t2.run_config.failure_config.max_failures == 1
    # A FailureConfig set for another field only: max_failures=0 is Ray's default, so the
    # budget applies and the field set is kept (the run once never restarted, silently).
    other = FailureConfig(controller_failure_limit=0)
    t3 = make_trainer(_loop, tmp_path, failure_config=other)
    assert t3.run_config.failure_config.max_failures == 3
    assert t3.run_config.failure_config.controller_failure_limit == 0
    assert other.max_failures == 0  # the caller's own is not changed


def test_bad_guard_config_is_a_clear_error():
    with pytest.raises(rayguard.ConfigError, match="guard_config"):
        rayguard.RobustTrainer(_loop, guard_config={"seed": 1})


def _bad_env_loop(config):
    rayguard.train.report({"loss": 1.0})


def test_outside_worker_calls_say_what_to_do():
    with pytest.raises(rayguard.RayGuardError, match="inside the training function"):
        rayguard.train.get_context()
    with pytest.raises(rayguard.RayGuardError, match="inside the training function"):
        rayguard.train.report({"loss": 1.0})
