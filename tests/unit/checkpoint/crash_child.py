"""A real process that saves checkpoints and dies mid-save (run by test_checkpoint_crash.py).

    crash_child.py random ROOT SEED          3 times: fork a child that saves steps in a loop,
                                             SIGKILL it at a random moment after its first save
    crash_child.py phases ROOT               for each kill point, fork a child that saves
                                             ROOT/<point>/checkpoint_000002 and SIGKILLs itself there

Every tensor of step s's state is filled with s, so a test can tell a mixed-up checkpoint.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

from rayguard.checkpoint import save
from rayguard.checkpoint.commit import cleanup_staging
from rayguard.checkpoint.fsio import set_phase_hook, set_write_fault_hook

KILL_POINTS = ("mid-shard", "shard-written", "manifest-written", "published")


def make_state(step: int, mib: int = 6) -> dict:
    n = mib * 1024 * 1024 // 4 // 3
    return {
        "model": {"a": torch.full((n,), float(step)), "b": torch.full((n,), float(step)).bfloat16()},
        "optim": {"state": {0: {"exp_avg": torch.full((n // 2,), float(step))}}, "param_groups": [{"lr": 0.1}]},
        "step": step,
    }


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def loop(root: Path, first: int, notify_fd: int) -> None:
    cleanup_staging(root)
    step = first
    while True:
        save(root / f"checkpoint_{step:06d}", make_state(step), step=step)
        os.write(notify_fd, b"s")
        step += 1


def random_kills(root: Path, seed: int) -> None:
    rng = random.Random(seed)
    for attempt in range(3):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            loop(root, 100 * (attempt + 1), write_fd)
        os.close(write_fd)
        os.read(read_fd, 1)  # one complete save, then a random moment of a later one
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(read_fd)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print(f"attempt{attempt} {'killed' if killed else 'survived'}", flush=True)


def phases(root: Path) -> None:
    for point in KILL_POINTS:
        run_root = root / point
        save(run_root / "checkpoint_000001", make_state(1), step=1)
        pid = os.fork()
        if pid == 0:
            if point == "mid-shard":
                set_write_fault_hook(lambda path, off, n: die() if off + n > 2 * 1024 * 1024 else None)
            else:
                set_phase_hook(lambda name, path, point=point: die() if name == point else None)
            save(run_root / "checkpoint_000002", make_state(2), step=2)
            os._exit(3)  # not killed: the test reports it
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print(f"{point} {'killed' if killed else 'survived'}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)  # no OpenMP pool: fork-safe
    mode, root = sys.argv[1], Path(sys.argv[2])
    if mode == "random":
        random_kills(root, int(sys.argv[3]))
    else:
        phases(root)
