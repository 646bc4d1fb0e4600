"""How long a checkpoint blocks the training loop, and what it costs a loop of steps.

Part of ``bench_checkpoint.py`` (same run, same state); alone:
    .venv/bin/python tests/benchmarks/bench_checkpoint_async.py [--size-mib 1024] [--reps 3]
    (or RAYGUARD_BENCH_SIZE_MIB=256 for a quick run)

Blocked time per checkpoint, interleaved per repetition (the background part of each is
waited for outside the timing, so every checkpoint starts with nothing in flight):
  copy_ floor           copy_ of every tensor into preallocated buffers
  rayguard async        rayguard.train.report(state=) in a worker session, mode="async"
                        (intent, checks, snapshot into reused buffers, RNG, hand-off)
  rayguard sync         the same call, mode="sync" (snapshot-free: write, hash, fsync, commit)
  torch.save+fsync      torch.save + fsync of file and directory
  dcp.async_save        torch.distributed.checkpoint.async_save, the part before it returns
                        (a one-process gloo group)

Then a loop of steps with a checkpoint every k steps (k chosen so that the background save
fits: 1.5x the sync save time in steps): steps/s with no checkpoints, async, sync; once with
an idle-host step (a CUDA matmul when there is a GPU, else a 5 ms sleep: the host waits as in
a GPU-bound step, leaving the cores to the background save) and once with a CPU matmul step
(the loop and the save compete for the same cores).
Prints medians and ratios; never fails on a time. ``--cuda`` (a GPU machine): the same state
on the GPU; the floor is then a non-blocking copy into pinned buffers (the pinned
device-to-host bandwidth).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))

from bench_checkpoint import fsync_path, make_state, state_bytes  # noqa: E402


def make_session(run_dir: str, mode: str) -> Any:
    """A real WorkerSession of a one-rank run without Ray: no coordinator, and metrics are
    not forwarded to ray.train (the only part that needs a Ray worker)."""
    import rayguard
    from rayguard.train import forwarding
    from rayguard.train.context import GuardContext
    from rayguard.train.setup import build_session
    from rayguard.train.store import LocalStore

    forwarding._forward = lambda *args: None  # type: ignore[assignment]
    ctx = GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       node_id="bench", device=torch.device("cpu"), seed=0, attempt=0,
                       run_dir=run_dir)
    guard = rayguard.GuardConfig(checkpoint=rayguard.CheckpointConfig(mode=mode), numa="off")
    return build_session(ctx, guard, None, (), store=LocalStore(run_dir))


def settle(session: Any) -> None:
    """Wait for the checkpoint in flight (outside any timing)."""
    if session.async_checkpoints is not None:
        session.async_checkpoints.drain()


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _dcp_group(work: Path) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{work}/pg", rank=0, world_size=1)


def blocked_times(state: dict, work: Path, reps: int) -> dict[str, list[float]]:
    import torch.distributed.checkpoint as dcp

    srcs = _tensors(state)
    cuda = any(t.is_cuda for t in srcs)  # the floor: pinned device-to-host bandwidth
    floor_bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for t in srcs]

    def floor() -> None:
        for b, t in zip(floor_bufs, srcs, strict=True):
            b.copy_(t, non_blocking=t.is_cuda)
        if cuda:
            torch.cuda.synchronize()

    sessions = {m: make_session(str(work / f"run-{m}"), m) for m in ("async", "sync")}
    _dcp_group(work)
    times: dict[str, list[float]] = {}
    step = 0

    def report(mode: str) -> None:
        nonlocal step
        step += 1
        sessions[mode].report({"loss": 1.0}, state={**state, "step": step}, step=step)

    for rep in range(reps + 1):  # the first repetition warms up (allocates the buffers)
        ops: dict[str, Callable[[], object]] = {
            "copy_ floor": floor,
            "rayguard async": lambda: report("async"),
            "rayguard sync": lambda: report("sync"),
            "torch.save+fsync": lambda: _torch_save(work / "torch.pt", state),
        }
        pending: list[Any] = []
        ops["dcp.async_save"] = lambda: pending.append(  # noqa: B023
            dcp.async_save(state, checkpoint_id=str(work / f"dcp{rep}")))  # noqa: B023
        for name, fn in ops.items():
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
            settle(sessions["async"])
            for fut in pending:
                fut.result()
            if rep:
                times.setdefault(name, []).append(elapsed)
        shutil.rmtree(work / f"dcp{rep}", ignore_errors=True)
        _prune(work)
        if rep:
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()),
                  flush=True)
    extra = sessions["async"].async_checkpoints.buffers.nbytes
    print(f"async snapshot buffers (extra host memory): {extra / 2**20:.0f} MiB", flush=True)
    return times


def _torch_save(path: Path, state: dict) -> None:
    torch.save(state, path)
    fsync_path(path)
    fsync_path(path.parent)


def _prune(work: Path) -> None:
    """Keep the disk small: drop committed checkpoints between repetitions."""
    for run in [*work.glob("run-*"), *work.glob("loop-*")]:
        for child in run.glob("checkpoint_*"):
            shutil.rmtree(child, ignore_errors=True)


def _matmul_step() -> Callable[[], None]:
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    return lambda: (a @ b).sum().item()  # type: ignore[return-value]


def _idle_host_step(step_ms: float) -> Callable[[], None]:
    """The host side of a GPU-bound step: the Python thread waits, the CPU cores are free."""
    if torch.cuda.is_available():
        a = torch.randn(4096, 4096, device="cuda")

        def step() -> None:
            (a @ a).sum().item()
        return step
    return lambda: time.sleep(step_ms / 1000)


def steps_per_second(state: dict, work: Path, step: Callable[[], None], *, sync_save_s: float,
                     checkpoints: int) -> dict[str, float]:
    """A loop of ``step``; every k steps a checkpoint of ``state`` (none/async/sync), k such
    that a background save (~ the sync save) fits in k steps with a 1.5x margin."""
    for _ in range(20):
        step()
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    measured_ms = (time.perf_counter() - t0) / 50 * 1000
    sessions = {m: make_session(str(work / f"loop-{m}"), m) for m in ("async", "sync")}
    persist_s = 0.0
    for session in sessions.values():  # one-time costs: first-report checks, buffers
        for warm in (10**8, 10**8 + 1):  # step numbers the loop never reaches
            t0 = time.perf_counter()
            session.report({"loss": 1.0}, state={**state, "step": warm}, step=warm)
            settle(session)
            persist_s = max(persist_s, time.perf_counter() - t0)
    k = max(1, math.ceil(1.5 * max(sync_save_s, persist_s) * 1000 / measured_ms))
    total = k * checkpoints
    print(f"  {measured_ms:.2f} ms/step, a save takes {persist_s:.2f} s here: a checkpoint "
          f"every k={k} steps, {total} steps per mode", flush=True)
    out: dict[str, float] = {}
    for mode in ("none", "async", "sync", "none again"):
        session = sessions.get(mode)
        blocked = 0.0
        t0 = time.perf_counter()
        for i in range(1, total + 1):
            step()
            if session is not None and i % k == 0:
                t1 = time.perf_counter()
                session.report({"loss": 1.0}, state={**state, "step": i}, step=i)
                blocked += time.perf_counter() - t1
        t1 = time.perf_counter()
        if session is not None:
            settle(session)  # the run ends when its last checkpoint is committed
        final = time.perf_counter() - t1
        elapsed = time.perf_counter() - t0
        out[mode] = total / elapsed
        out[f"{mode} steady"] = total / (elapsed - final)  # without the run's one final wait
        _prune(work)
        detail = ""
        if session is not None:
            detail = f"  (reports blocked {blocked:.2f} s in all, final wait {final:.2f} s"
            if session.async_checkpoints is not None:
                detail += (f", back-pressure {session.async_checkpoints.waits} wait(s) "
                           f"{session.async_checkpoints.waited_s:.2f} s")
            detail += ")"
        print(f"  {mode:<11} {out[mode]:8.1f} steps/s{detail}", flush=True)
    none = statistics.mean([out["none"], out["none again"]])
    print(f"  async / none = {out['async'] / none:.3f}  (target >= 0.95); "
          f"sync / none = {out['sync'] / none:.3f}", flush=True)
    print(f"  steady state (without the last checkpoint's wait at the end of the run, paid once "
          f"per run): async / none = {out['async steady'] / none:.3f}", flush=True)
    return out


def run_async(state: dict, *, reps: int, directory: str | None, step_ms: float = 5.0,
              checkpoints: int = 5) -> int:
    nbytes = state_bytes(state)
    work = Path(tempfile.mkdtemp(prefix="rg-bench-async-", dir=directory))
    try:
        print(f"\n== blocked time per checkpoint ({nbytes / 2**20:.0f} MiB, {reps} reps, "
              f"cores {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.1f})", flush=True)
        times = blocked_times(state, work, reps)
        med = {k: statistics.median(v) for k, v in times.items()}
        floor = med["copy_ floor"]
        print(f"\n{'operation':<22}{'blocked s':>10}{'x floor':>9}")
        for name, t in med.items():
            print(f"{name:<22}{t:>10.3f}{t / floor:>9.2f}")
        print(f"\nrayguard async / copy_ floor     = {med['rayguard async'] / floor:.2f}x  "
              "(target <= 1.3x)")
        print(f"rayguard sync / rayguard async   = {med['rayguard sync'] / med['rayguard async']:.1f}x")
        print(f"dcp.async_save / rayguard async  = {med['dcp.async_save'] / med['rayguard async']:.2f}x")
        print(f"torch.save+fsync / rayguard async = {med['torch.save+fsync'] / med['rayguard async']:.1f}x")
        kind = "CUDA matmul" if torch.cuda.is_available() else f"sleep {step_ms} ms"
        print(f"\n== steps/s, a checkpoint every k steps: an idle-host step ({kind}: the host "
              "waits as in a GPU-bound step)", flush=True)
        steps_per_second(state, work, _idle_host_step(step_ms), sync_save_s=med["rayguard sync"],
                         checkpoints=checkpoints)
        print("\n== steps/s, a checkpoint every k steps: a CPU matmul step (the loop competes "
              "with hashing and writing for the same cores)", flush=True)
        steps_per_second(state, work, _matmul_step(), sync_save_s=med["rayguard sync"],
                         checkpoints=checkpoints)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int,
                        default=int(os.environ.get("RAYGUARD_BENCH_SIZE_MIB", "1024")))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--cuda", action="store_true",
                        help="a CUDA state (the floor: pinned device-to-host copies)")
    args = parser.parse_args(argv)
    state = make_state(args.size_mib)
    if args.cuda:
        state = _to_cuda(state)
    return run_async(state, reps=args.reps, directory=args.dir)


def _to_cuda(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cuda()
    if isinstance(obj, dict):
        return {k: _to_cuda(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cuda(v) for v in obj]
    return obj


if __name__ == "__main__":
    sys.exit(main())
