"""Trial functions for the rayguard.tune Ray tests (imported by the tests; not a test)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from ray import tune

STEP_S = 0.1


def _fire_once(marker_dir: str, name: str) -> bool:
    """True the first time ``name`` is asked for in ``marker_dir`` (across processes)."""
    try:
        fd = os.open(Path(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def faulty(config: dict) -> None:
    """Reports ``loss`` each step with a checkpoint; ``config['kind']`` chooses the fault
    at step ``config['fault_step']``: nan, stall, diverge, or healthy. Each fault fires once
    per sweep (marker files) unless ``config['always']``."""
    kind, steps, k = config["kind"], config.get("steps", 12), config.get("fault_step", 5)
    start, resumed_from = 0, -1
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["step"]
        resumed_from = start
    for step in range(start + 1, steps + 1):
        time.sleep(config.get("step_s", STEP_S))
        loss = 1.0 / step + 0.5
        if step == k and kind != "healthy":
            fire = config.get("always") or _fire_once(config["marker_dir"], kind)
            if fire and kind == "nan":
                loss = float("nan")
            elif fire and kind == "diverge":
                loss = 1e4
            elif fire and kind == "stall":
                time.sleep(3600)
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"step": step}))
            tune.report({"loss": loss, "step": step, "resumed_from": resumed_from},
                        checkpoint=tune.Checkpoint.from_directory(d))


def forever(config: dict) -> None:
    """Reports and checkpoints every ``step_s`` until stopped."""
    step = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            step = json.loads(Path(d, "state.json").read_text())["step"]
    while step < config.get("steps", 10**9):
        step += 1
        time.sleep(config.get("step_s", STEP_S))
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"step": step}))
            tune.report({"loss": 1.0 / step, "step": step},
                        checkpoint=tune.Checkpoint.from_directory(d))
