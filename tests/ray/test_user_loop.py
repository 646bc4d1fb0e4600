"""The loop users already have, as a user runs it: a Ray-docs epoch loop under a plain swap of
``TorchTrainer`` for ``RobustTrainer`` (no ``GuardConfig``), a driver of its own with the
default console output (tests/ray/user_loop_driver.py, on the shared local cluster).

* one SIGKILL of rank 1: replaced alone (live recovery, the default), rank 0 keeping its
  process, from the last checkpoint; the replay and the progress line are counted in the
  loop's units (an epoch, or its optimizer steps: not the whole run);
* the console of that run against the same run without the kill: at most 15 more lines and
  no traceback;
* a ``RunConfig`` used for both fits is not changed by the first;
* a driver killed mid-run on remote storage: the run's event log is in storage.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rayguard.events.read import read as read_events
from rayguard.observe.goodput import goodput as compute_goodput

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("user_loop_driver.py")
MARK = "=== fit done:"


def _drive(ray_local, tmp_path, mode, timeout):
    address = ray_local.get_runtime_context().gcs_address
    return subprocess.run([sys.executable, str(SCRIPT), address, str(tmp_path), mode],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def _console(stdout: str) -> dict[str, list[str]]:
    """Each fit's console lines, split at the driver's markers."""
    fits: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(MARK):
            fits[line[len(MARK):].strip()] = lines
            lines = []
        else:
            lines.append(line)
    return fits


def test_a_plain_swap_epoch_loop_killed_once(ray_local, tmp_path):
    proc = _drive(ray_local, tmp_path, "pair", 600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    quiet, killed = out["quiet"], out["killed"]
    assert quiet["error"] is None and killed["error"] is None
    assert quiet["epoch"] == killed["epoch"] == 7
    assert out["env_untouched"]  # the first fit wrote nothing into the caller's RunConfig

    # live recovery (the default): rank 1 replaced alone; rank 0 kept its process and ran
    # every epoch, at most one twice
    epochs = [e for e, _ in killed["pids"]]
    assert len({pid for _, pid in killed["pids"]}) == 1, killed["pids"]
    assert sorted(set(epochs)) == list(range(8)) and 0 <= len(epochs) - 8 <= 1, epochs

    events = read_events(killed["run_dir"])
    restarts = [e for e in events if e.get("kind") == "restart"]
    assert len(restarts) == 1 and restarts[0].get("path") == "live", restarts
    assert restarts[0]["ranks"] == [1]
    goodput = compute_goodput(events)
    assert goodput.step_unit == "epoch", goodput
    # one epoch's 4 optimizer steps at most, not the 140 "steps" of a count from 0
    assert goodput.replayed_steps <= (1 if goodput.replay_unit == "epoch" else 4), goodput

    console = _console(proc.stdout)
    assert not any("Traceback" in line for line in console["killed"]), console["killed"]
    assert len(console["killed"]) - len(console["quiet"]) <= 15, "\n".join(console["killed"])
    progress = [line for line in console["killed"] if "| attempt " in line]
    assert progress and all(re.search(r"\bepoch \d+ \| ", line) and "checkpoint epoch" in line
                            for line in progress), progress
    assert any("goodput" in line and "1 restart" in line for line in console["killed"]), \
        "\n".join(console["killed"][-10:])


def test_a_killed_driver_leaves_its_event_log_in_remote_storage(ray_local, tmp_path):
    proc = _drive(ray_local, tmp_path, "driver-kill", 300)
    assert proc.returncode == -9, proc.stdout[-4000:]
    logs = list((tmp_path / "bucket" / "runs").glob("*/rayguard_events.jsonl"))
    assert len(logs) == 1, proc.stdout[-2000:]
    kinds = [e.get("kind") for e in read_events(logs[0].parent)]
    assert "start" in kinds and "attempt_started" in kinds, kinds
