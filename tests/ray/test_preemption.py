"""Preemption and checkpoint pacing, one run: the loop saves only when
``rayguard.train.should_checkpoint()`` says so, which paces checkpoints at the configured
interval on every rank; SIGTERM to one worker mid-run makes every rank checkpoint at the next
step, then that worker exits and the next attempt resumes from the just-in-time checkpoint,
not from the last paced one (these were two fits: the pacing and the SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import time

import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.train.preemption import sigterm_notice

INTERVAL_S = 1.0


def preempted_loop(config):
    """The whole loop change for pacing: ``state=state if should_checkpoint() else None``."""
    ctx = rayguard.train.get_context()
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    weight = torch.zeros(4) if state is None else state["w"]
    asked = os.path.join(config["out"], f"asked-a{ctx.attempt}-r{ctx.rank}.jsonl")
    for step in range(start, config["steps"]):
        time.sleep(config["step_s"])
        weight = weight + 1.0
        if ctx.attempt == 0 and ctx.rank == 1 and step == config["sigterm_at"]:
            os.kill(os.getpid(), signal.SIGTERM)  # the notice a spot machine gets
            while sigterm_notice() is None:  # the handler runs on the actor's main thread
                rayguard.train.heartbeat()
                time.sleep(0.05)
        save = rayguard.train.should_checkpoint()
        if save:
            with open(asked, "a") as f:
                f.write(json.dumps(step) + "\n")
        rayguard.train.report({"loss": 1.0, "step": step, "start": start},
                              state={"step": step, "w": weight} if save and ctx.rank == 0 else None)


def _asked(out, attempt: int, rank: int) -> list[int]:
    path = out / f"asked-a{attempt}-r{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sigterm_checkpoints_just_in_time_between_checkpoints_paced_at_the_interval(
        ray_local, tmp_path):
    result = rayguard.RobustTrainer(
        preempted_loop, train_loop_config={"steps": 70, "sigterm_at": 30, "step_s": 0.1,
                                           "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="preempt"),
        guard_config=rayguard.GuardConfig(numa="off", checkpoint=rayguard.CheckpointConfig(
            min_interval_s=INTERVAL_S, max_interval_s=INTERVAL_S))).fit()
    events = read_events(result.path)
    notices = [e for e in events if e["kind"] == "preemption_notice"]
    saved = [e for e in events if e["kind"] == "preemption_checkpoint"]
    restored = [e for e in events if e["kind"] == "restored"]
    commits = [e for e in events if e["kind"] == "checkpoint_committed"]
    # the preemption: noticed at step 30's report, every rank checkpoints at the next step;
    # when the paced checkpoint falls due at step 30 itself, that save answers the notice
    # (tests/unit/train/test_preemption.py proves both)
    assert [(e["rank"], e["attempt"], e["source"]) for e in notices] == [(1, 0, "SIGTERM")]
    assert len(saved) == 1 and saved[0]["attempt"] == 0
    jit_step = saved[0]["step"]
    for rank in range(2):
        first_asked = min((s for s in _asked(tmp_path, 0, rank) if s >= 30), default=None)
        assert first_asked == jit_step, (rank, _asked(tmp_path, 0, rank), jit_step)
    assert jit_step in (30, 31)
    paced_before = [e["step"] for e in commits if e["attempt"] == 0 and e["step"] < jit_step]
    assert paced_before, commits  # the paced ones before it are older
    assert [(e["attempt"], e["step"]) for e in restored] == [(1, jit_step)]
    assert result.metrics["start"] == jit_step + 1
    # the pacing: the same steps asked on every rank, each committed, never faster than the
    # interval (event-time jitter aside); attempt 1 runs whole
    asked = [_asked(tmp_path, 1, r) for r in range(2)]
    assert asked[0] == asked[1] and len(asked[0]) >= 2, asked
    assert _asked(tmp_path, 0, 0)[:len(paced_before)] == paced_before
    assert _asked(tmp_path, 0, 1)[:len(paced_before)] == paced_before
    assert [e["step"] for e in commits if e["attempt"] == 1] == asked[0]
    for attempt in (0, 1):
        times = [e["time"] for e in commits if e["attempt"] == attempt and e["step"] != jit_step]
        gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
        assert min(gaps, default=INTERVAL_S) >= INTERVAL_S / 2, (attempt, gaps)
    from rayguard.checkpoint.interval_advice import recommend_interval

    after = [e for e in events if e["time"] >= saved[0]["time"]]
    print("seconds from the just-in-time checkpoint to the restart:",
          next(e["time"] for e in after if e["kind"] == "restart") - saved[0]["time"],
          "| paced at", paced_before, asked[0], "|", recommend_interval(events).line())
