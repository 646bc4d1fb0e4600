"""Checkpoint cost: rayguard save/load (hashing + fsync + verify) against the baselines.

Run:  .venv/bin/python tests/benchmarks/bench_checkpoint.py [--size-mib 1024] [--reps 3] [--quick]

In one process, on one state (several large fp32 and bf16 tensors plus a small
optimizer-like dict), it times, interleaved per repetition:
  raw write        os.write of the same number of bytes + fsync (the disk's bandwidth)
  torch.save       torch.save(state, path) + fsync of file and directory
  dcp.save         torch.distributed.checkpoint.save(..., no_dist=True) (fsyncs its files)
  rayguard.save    rayguard.checkpoint.save (hash while writing, fsync, manifest, rename)
  torch.load       torch.load(path, weights_only=True)            (page cache warm)
  rayguard.load    rayguard.checkpoint.load (verify every byte)  (page cache warm)
(the saves in an order rotated per repetition, so none always follows another's write-back),
and prints medians and the ratios against the targets (save <= 1.10x torch.save+fsync,
load+verify <= 1.15x torch.load). Never fails on a time: it is a measurement.

Then, on the same state (skip with --no-async; bench_checkpoint_async.py says more): the time
the training loop is blocked per checkpoint for rayguard async vs rayguard sync vs
torch.save+fsync vs dcp.async_save vs a plain copy_ into preallocated buffers (the floor;
target: async <= 1.3x it), and steps/s of a loop of matmul steps with a checkpoint every k
steps: none vs async vs sync (target: async within 5% of none).
The size: --size-mib, or RAYGUARD_BENCH_SIZE_MIB (e.g. 256 for a quick run).

Sharded case:  .venv/bin/python tests/benchmarks/bench_checkpoint.py --sharded [--size-mib 512]
Two CPU processes (gloo) hold a state of DTensors sharded over both (model weights and
AdamW-like moments, --size-mib in all); interleaved per repetition:
  dcp.save              torch.distributed.checkpoint.save (fsyncs its files)
  rayguard.save         the sharded commit protocol of report(sharded=...): DCP into staging,
                        plain shard with RNG, every DCP file hashed, manifest, atomic rename
  dcp.load              torch.distributed.checkpoint.load, in place          (page cache warm)
  rayguard.load+verify  as load_state(sharded=...) does: every rank checks its share (sizes,
                        .metadata and plain shards hashed), then DCP loads through the
                        verifying reader (each chunk hashed as read, before use), the ranks
                        agree; plain shards read                         (page cache warm)
  rayguard.verify only  the separate hashing pass of every file's share (what the load made
                        before DCP read, until the reader verified while reading)
and prints rank 0's medians and the ratios (targets: save <= 1.15x dcp.save, load+verify
<= 1.2x dcp.load).

The three targets in one run:  .venv/bin/python tests/benchmarks/bench_checkpoint.py --targets
runs the plain save/load and the sharded case one after the other and prints, for each
target, the baseline, rayguard and the ratio. --threads N sets the hashing threads per
process (default one per core, at most 16); --cores N pins the run to the first N cores
(e.g. --cores 2 for the 2-core figures on a larger machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rayguard import checkpoint as ck


def make_state(size_mib: int) -> dict:
    total = size_mib * 1024 * 1024
    g = torch.Generator().manual_seed(0)
    fp32 = [torch.randn(int(total * 0.6 / 3 / 4), generator=g) for _ in range(3)]
    bf16 = [torch.randn(int(total * 0.3 / 3 / 2), generator=g).bfloat16() for _ in range(3)]
    small_elems = int(total * 0.1 / 200 / 4)
    optim = {
        "state": {i: {"step": torch.tensor(float(i)), "exp_avg": torch.randn(small_elems, generator=g)} for i in range(200)},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": list(range(200))}],
    }
    return {"model": {f"fp32_{i}": t for i, t in enumerate(fp32)} | {f"bf16_{i}": t for i, t in enumerate(bf16)},
            "optim": optim, "step": 1234}  # fmt: skip


def state_bytes(state: dict) -> int:
    n = 0
    for t in list(state["model"].values()) + [s["exp_avg"] for s in state["optim"]["state"].values()]:
        n += t.numel() * t.element_size()
    return n


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write(path: Path, buf: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < buf.nbytes:
            done += os.write(fd, buf[done:])
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(path.parent)


def torch_save(path: Path, state: dict) -> None:
    torch.save(state, path)
    fsync_path(path)
    fsync_path(path.parent)


def dcp_save(path: Path, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(path), no_dist=True)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_rep(d: Path, rep: int, state: dict, raw_src: memoryview, times: dict[str, list[float]], *, dcp: bool) -> None:
    """One repetition of every operation, interleaved, into ``times``."""
    d.mkdir()
    ops: dict[str, Callable[[], object]] = {
        "raw write+fsync": lambda: raw_write(d / "raw.bin", raw_src),
        "torch.save+fsync": lambda: torch_save(d / "torch.pt", state),
        "rayguard.save": lambda: ck.save(d / "checkpoint_rg", state, step=rep),
    }
    if dcp:
        ops["dcp.save"] = lambda: dcp_save(d / "dcp", state)
    names = list(ops)
    names = names[rep % len(names):] + names[: rep % len(names)]  # rotate: no fixed order
    for name in names:
        times.setdefault(name, []).append(timed(ops[name]))
    (d / "raw.bin").unlink()
    shutil.rmtree(d / "dcp", ignore_errors=True)
    loads: dict[str, Callable[[], object]] = {
        "torch.load(weights_only)": lambda: torch.load(d / "torch.pt", weights_only=True),
        "rayguard.load+verify": lambda: ck.load(d / "checkpoint_rg"),
        "rayguard.load (no verify)": lambda: ck.load(d / "checkpoint_rg", verify=False),
        "rayguard.verify only": lambda: ck.verify(d / "checkpoint_rg"),
    }
    for name, fn in loads.items():
        times.setdefault(name, []).append(timed(fn))
    shutil.rmtree(d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int,
                        default=int(os.environ.get("RAYGUARD_BENCH_SIZE_MIB", "1024")))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="256 MiB, 2 repetitions")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--no-dcp", action="store_true", help="skip torch.distributed.checkpoint")
    parser.add_argument("--no-async", action="store_true",
                        help="skip the blocked-time and steps/s part (async vs sync)")
    parser.add_argument("--sharded", action="store_true",
                        help="the sharded case: DTensor state over 2 processes (default 512 MiB)")
    parser.add_argument("--targets", action="store_true",
                        help="plain and sharded in one run; print the three targets together")
    parser.add_argument("--threads", type=int, default=None,
                        help="hashing threads per process (default: one per core, at most 16)")
    parser.add_argument("--cores", type=int, default=None,
                        help="pin the run (and its worker processes) to the first N cores")
    args = parser.parse_args(argv)
    if args.cores:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    if args.threads:
        from rayguard.checkpoint import hashing

        hashing.MAX_HASH_THREADS = args.threads
    if args.quick:
        args.size_mib, args.reps = 256, 2
    if args.sharded or args.targets:
        from bench_checkpoint_sharded import run_sharded

        sharded_mib = 512 if args.size_mib == 1024 and not args.quick else args.size_mib
    if args.sharded:
        run_sharded(size_mib=sharded_mib, reps=args.reps, directory=args.dir, threads=args.threads)
        return 0
    state = make_state(args.size_mib)
    nbytes = state_bytes(state)
    raw_buf = memoryview(state["model"]["fp32_0"].numpy()).cast("B")
    raw_src = memoryview(bytearray(nbytes)) if raw_buf.nbytes < nbytes else raw_buf[:nbytes]
    work = Path(tempfile.mkdtemp(prefix="rg-bench-ckpt-", dir=args.dir))
    times: dict[str, list[float]] = {}
    print(f"state: {nbytes / 2**20:.0f} MiB in {len(state['model']) + 200} tensors; dir {work}; "
          f"cores {len(os.sched_getaffinity(0))}; torch {torch.__version__}", flush=True)  # fmt: skip
    try:
        for rep in range(args.reps):
            run_rep(work / f"rep{rep}", rep, state, raw_src, times, dcp=not args.no_dcp)
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = report(times, nbytes)
    if args.targets:
        smed = run_sharded(size_mib=sharded_mib, reps=args.reps, directory=args.dir,
                           threads=args.threads)
        print_targets(med, smed, threads=args.threads)
        return 0
    if not args.no_async:
        from bench_checkpoint_async import run_async

        run_async(state, reps=args.reps, directory=args.dir)
    return 0


def print_targets(plain: dict[str, float], sharded: dict[str, float], threads: int | None) -> None:
    """The three targets of one run: baseline, rayguard, ratio."""
    from rayguard.checkpoint.hashing import default_threads

    rows = [("sync plain save", "torch.save+fsync", plain["torch.save+fsync"], plain["rayguard.save"], 1.10),
            ("sharded save", "dcp.save", sharded["dcp.save"], sharded["rayguard.save"], 1.15),
            ("sharded load+verify", "dcp.load", sharded["dcp.load"], sharded["rayguard.load+verify"], 1.2)]
    print(f"\ntargets (cores {len(os.sched_getaffinity(0))}, hashing threads per process "
          f"{threads or default_threads()}):")
    print(f"{'target':<22}{'baseline':<18}{'base s':>8}{'ours s':>8}{'ratio':>8}{'target':>8}")
    for name, base_name, base, ours, target in rows:
        print(f"{name:<22}{base_name:<18}{base:>8.3f}{ours:>8.3f}{ours / base:>7.2f}x{target:>7.2f}x")


def report(times: dict[str, list[float]], nbytes: int) -> dict[str, float]:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{'operation':<28}{'median s':>10}{'GiB/s':>8}")
    for name, t in med.items():
        print(f"{name:<28}{t:>10.3f}{nbytes / 2**30 / t:>8.2f}")
    save_ratio = med["rayguard.save"] / med["torch.save+fsync"]
    load_ratio = med["rayguard.load+verify"] / med["torch.load(weights_only)"]
    print(f"\nrayguard.save / torch.save+fsync       = {save_ratio:.2f}x  (target <= 1.10x)")
    if "dcp.save" in med:
        print(f"rayguard.save / dcp.save               = {med['rayguard.save'] / med['dcp.save']:.2f}x")
    print(f"rayguard.save / raw write+fsync        = {med['rayguard.save'] / med['raw write+fsync']:.2f}x")
    print(f"rayguard.load+verify / torch.load      = {load_ratio:.2f}x  (target <= 1.15x)")
    return med


if __name__ == "__main__":
    sys.exit(main())
