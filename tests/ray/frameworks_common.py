"""Shared pieces of the framework tests (test_frameworks_*.py; imported by them, not a test):
load an example as a module the workers can unpickle, fire a fault once across processes,
damage the newest checkpoint of a run, read the run's event log."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import ray.cloudpickle as cloudpickle

from rayguard.testing.forge import flip_byte

ROOT = Path(__file__).resolve().parents[2]

LIVE_WAIT_S = 120.0
"""``HealthConfig(live_wait_s=)`` of the faults runs: a replacement importing its framework in
a new process took over the default 30 s on the 2-core machine with a 16-worker run beside it,
and the run then rightly restarted the whole group; what these runs prove is the live path."""


def load(name: str, path: Path) -> ModuleType:
    """``path`` imported as module ``name``, pickled by value (workers cannot import it)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def example(name: str) -> ModuleType:
    return load(f"rayguard_example_{name}", ROOT / "examples" / f"{name}.py")


def fire_once(marker: str) -> bool:
    """True the first time ``marker`` is asked for (the file is created then, in any process)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def kill_self() -> None:
    """A real process death: no exception, no clean-up, no report."""
    os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_dirs(run_dir: str) -> list[str]:
    """The run's persisted Ray checkpoints, oldest first (Ray names them by time)."""
    return sorted(str(p) for p in Path(run_dir).glob("checkpoint_*") if p.is_dir())


def wait_registered(run_dir: str, timeout_s: float = 120) -> str:
    """Wait until Ray's controller has registered the run's newest checkpoint (its snapshot
    names it) and return that checkpoint's path.

    A kill before that loses the checkpoint by Ray's design: the controller collects each
    worker's reports by polling it, so a report still queued in a process that dies is never
    registered, and ``ray.train.get_checkpoint()`` offers only registered checkpoints. The
    kills below wait for it, so which checkpoint a restart resumes from is not a race."""
    newest = checkpoint_dirs(run_dir)[-1]
    snapshot = Path(run_dir, "checkpoint_manager_snapshot.json")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]
            if latest and latest["checkpoint_dir_name"] == os.path.basename(newest):
                return newest
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not written yet, or being replaced
        time.sleep(0.05)
    raise TimeoutError(f"Ray never registered {newest} (see {snapshot})")


def kill_after_registered(run_dir: str, *, corrupt: str | None = None,
                          note: str | None = None) -> None:
    """SIGKILL this process once Ray has registered the newest checkpoint; with ``corrupt``
    (a path inside a checkpoint), first flip a byte of that file in the newest checkpoint and
    write the checkpoint's path to ``note`` (for the test to name it)."""
    newest = wait_registered(run_dir)
    if corrupt is not None:
        flip_byte(os.path.join(newest, corrupt))
        Path(note).write_text(newest)
    kill_self()


def events(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "rayguard_events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kinds(run_dir: str) -> list[str]:
    return [e["kind"] for e in events(run_dir)]


WARNING_KINDS = ("stall_detected", "restart", "worker_died", "nan_detected",
                 "checkpoint_rejected", "crash_loop", "not_retried")


def assert_clean(result, run_dir: str) -> None:
    """The run finished with no stall, restart or other rayguard warning in its log."""
    assert result.error is None, result.error
    log = kinds(run_dir)
    assert "finished" in log, log
    bad = [e for e in events(run_dir) if e["kind"] in WARNING_KINDS]
    assert not bad, json.dumps(bad, indent=1)[:4000]


def assert_sealed(result, run_dir: str, count: int) -> None:
    """Each of the run's ``count`` checkpoints was sealed by rayguard as it was reported, and
    the last one verifies (every file's size and sha256 in its manifest)."""
    import rayguard

    committed = [e for e in events(run_dir) if e["kind"] == "checkpoint_committed"]
    assert len(committed) == count, committed
    assert all(e.get("source") == "ray.train.report" for e in committed), committed
    report = rayguard.checkpoint.verify(result.checkpoint.path)
    assert report.ok, report.describe()


def rejected_names(run_dir: str) -> list[str]:
    """Checkpoint directory names named by a ``checkpoint_rejected`` event."""
    names = []
    for e in events(run_dir):
        if e["kind"] == "checkpoint_rejected":
            text = json.dumps(e)
            names += [os.path.basename(d) for d in checkpoint_dirs(run_dir)
                      if os.path.basename(d) in text]
    return names


@dataclass(frozen=True)
class FaultsRun:
    """A module's one run with every fault in sequence (``faults`` fixtures): its result, its
    run directory, the loops' step log and the folder of the injectors' marker files."""

    result: Any
    run_dir: str
    log: str
    marker_dir: str

    def damaged(self) -> str:
        """The checkpoint the second kill damaged (its injector wrote the path)."""
        return Path(self.marker_dir, "corrupted").read_text()


def starts_by_attempt(log: str) -> dict[int, int]:
    """Rank 0's first completed step in each attempt, from the loops' step log: where each
    run of the training function began (rank 0 is never the killed rank in these tests)."""
    first: dict[int, int] = {}
    if os.path.exists(log):
        for line in Path(log).read_text().splitlines():
            rec = json.loads(line)
            if rec["rank"] == 0:
                first.setdefault(rec["attempt"], rec["step"])
    return first


def per_attempt(run_dir: str, kind: str, *fields: str) -> dict[int, list]:
    """The ``kind`` events of the run's log grouped by the attempt that recorded them, each
    as its ``fields`` (one field: the value; several: a tuple), in the log's order."""
    grouped: dict[int, list] = {}
    for e in events(run_dir):
        if e["kind"] == kind:
            values = tuple(e.get(f) for f in fields)
            grouped.setdefault(e["attempt"], []).append(
                values[0] if len(fields) == 1 else values)
    return grouped


def assert_same_weights(expected: dict, got: dict) -> None:
    """Every tensor of ``got`` equals (bit for bit) the one of the same name in ``expected``."""
    import torch

    assert expected.keys() == got.keys()
    unequal = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not unequal, f"weights differ from the fault-free run: {unequal}"


def record_step(log: str, step: int) -> None:
    """Append ``{rank, attempt, pid, step}`` (rayguard's context) to ``log``."""
    import rayguard

    ctx = rayguard.train.get_context()
    with open(log, "a") as f:
        f.write(json.dumps({"rank": ctx.rank, "attempt": ctx.attempt, "pid": os.getpid(),
                            "step": step}) + "\n")


def assert_kill_recovered(run_dir: str, log: str, attempt: int, restored: int, *,
                          fallback: bool) -> None:
    """Attempt ``attempt`` ended with rank 1's death, recovered live; the next attempt
    restored the checkpoint of step ``restored`` (``fallback``: not the newest) and ran from
    the step after it."""
    assert per_attempt(run_dir, "worker_died", "rank")[attempt] == [1]
    assert per_attempt(run_dir, "restart", "cause", "path")[attempt] == [("kill", "live")]
    assert per_attempt(run_dir, "restored", "step", "fallback")[attempt + 1] == [
        (restored, fallback)]
    assert starts_by_attempt(log)[attempt + 1] == restored + 1


def assert_rejected_once(run_dir: str, damaged: str, attempt: int) -> None:
    """``damaged`` was rejected once, by ``attempt``, and the run's rejection list names it."""
    assert per_attempt(run_dir, "checkpoint_rejected", "path") == {attempt: [damaged]}
    assert rejected_names(run_dir) == [os.path.basename(damaged)]
    rejected = Path(run_dir, "rayguard_rejected.json").read_text()
    assert os.path.basename(damaged) in rejected
