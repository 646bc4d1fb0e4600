"""Preemption: SIGTERM to one worker mid-run makes every rank checkpoint at the next step
(rayguard.train.should_checkpoint()), then that worker exits and the next attempt resumes
from the just-in-time checkpoint, not from the last periodic one."""

from __future__ import annotations

import os
import signal
import time

import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.train.preemption import sigterm_notice

PERIOD = 25


def preempted_loop(config):
    ctx = rayguard.train.get_context()
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    weight = torch.zeros(4) if state is None else state["w"]
    for step in range(start, config["steps"]):
        weight = weight + 1.0
        if ctx.attempt == 0 and ctx.rank == 1 and step == config["sigterm_at"]:
            os.kill(os.getpid(), signal.SIGTERM)  # the notice a spot machine gets
            while sigterm_notice() is None:  # the handler runs on the actor's main thread
                rayguard.train.heartbeat()
                time.sleep(0.05)
        save = rayguard.train.should_checkpoint() or step % PERIOD == 0
        rayguard.train.report({"loss": 1.0, "step": step, "start": start},
                              state={"step": step, "w": weight} if save and ctx.rank == 0 else None)


def test_sigterm_checkpoints_just_in_time_and_the_restart_resumes_from_it(ray_local, tmp_path):
    result = rayguard.RobustTrainer(
        preempted_loop, train_loop_config={"steps": 60, "sigterm_at": 30},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="preempt"),
        guard_config=rayguard.GuardConfig(numa="off")).fit()
    events = read_events(result.path)
    notices = [e for e in events if e["kind"] == "preemption_notice"]
    saved = [e for e in events if e["kind"] == "preemption_checkpoint"]
    restored = [e for e in events if e["kind"] == "restored"]
    assert [(e["rank"], e["attempt"], e["source"]) for e in notices] == [(1, 0, "SIGTERM")]
    assert len(saved) == 1 and saved[0]["attempt"] == 0
    jit_step = saved[0]["step"]
    assert jit_step == 31  # noticed at step 30's report: every rank checkpoints at the next step
    assert [(e["attempt"], e["step"]) for e in restored] == [(1, jit_step)]  # not step 25
    assert result.metrics["start"] == jit_step + 1
    after = [e for e in events if e["time"] >= saved[0]["time"]]
    print("seconds from the just-in-time checkpoint to the restart:",
          next(e["time"] for e in after if e["kind"] == "restart") - saved[0]["time"],
          [(e["kind"], e.get("rank"), round(e["time"] - saved[0]["time"], 2)) for e in after[:8]])


def paced_loop(config):
    """The whole loop change: ``state=state if should_checkpoint() else None``."""
    import json

    ctx = rayguard.train.get_context()
    asked = []
    for step in range(config["steps"]):
        time.sleep(config["step_s"])
        save = rayguard.train.should_checkpoint()
        if save:
            asked.append(step)
        rayguard.train.report({"loss": 1.0, "step": step},
                              state={"step": step, "w": torch.ones(4) * ctx.rank} if save else None)
    with open(os.path.join(config["out"], f"asked_{ctx.rank}.json"), "w") as f:
        json.dump(asked, f)


def test_should_checkpoint_paces_checkpoints_at_the_interval_on_every_rank(ray_local, tmp_path):
    import json

    interval_s = 1.0
    result = rayguard.RobustTrainer(
        paced_loop, train_loop_config={"steps": 30, "step_s": 0.1, "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="paced"),
        guard_config=rayguard.GuardConfig(numa="off", checkpoint=rayguard.CheckpointConfig(
            min_interval_s=interval_s, max_interval_s=interval_s))).fit()
    asked = [json.loads((tmp_path / f"asked_{r}.json").read_text()) for r in range(2)]
    assert asked[0] == asked[1]  # the same steps on every rank
    assert len(asked[0]) >= 2
    commits = [e for e in read_events(result.path) if e["kind"] == "checkpoint_committed"]
    assert [e["step"] for e in commits] == asked[0]  # each one the policy asked for, committed
    times = [e["time"] for e in commits]
    gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
    assert min(gaps) >= interval_s / 2  # never faster than the interval (event-time jitter aside)
    from rayguard.checkpoint.interval_advice import recommend_interval

    rec = recommend_interval(read_events(result.path))
    print("paced checkpoints at steps", asked[0], "gaps", [round(g, 2) for g in gaps],
          "|", rec.line())
