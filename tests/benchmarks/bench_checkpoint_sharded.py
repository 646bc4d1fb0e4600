"""The sharded case of bench_checkpoint.py (run it through ``bench_checkpoint.py --sharded``):
rayguard's sharded save and load+verify against plain DCP on the same DTensor state, two
gloo processes, interleaved per repetition. Prints rank 0's medians and the ratios.
``threads``: hashing threads per process (default: one per core, at most 16)."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rayguard.checkpoint.commit import staging_dir_for
from rayguard.checkpoint.reader import read_shard

WORLD = 2


def make_sharded_state(size_mib: int, rank: int) -> dict:
    """``size_mib`` in all, this rank's half: 60% weights, 40% two moments, Shard(0)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (WORLD,))
    per_rank = size_mib * 2**20 // WORLD
    g = torch.Generator().manual_seed(rank)

    def shard(nbytes: int) -> DTensor:
        local = torch.randn(nbytes // 4 // 1024, 1024, generator=g)
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False)

    n = 6
    model = {f"layer{i}.weight": shard(int(per_rank * 0.6 / n)) for i in range(n)}
    optim = {f"layer{i}.weight": {"exp_avg": shard(int(per_rank * 0.2 / n)),
                                  "exp_avg_sq": shard(int(per_rank * 0.2 / n))} for i in range(n)}
    return {"model": model, "optim": optim}


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def _rayguard_save(root: Path, rep: int, rank: int, sharded: dict) -> None:
    from rayguard import checkpoint as ck
    from rayguard.train import sharded as adapter

    final = str(root / f"checkpoint_{rep:09d}_a0")
    payload = {"__rayguard__": {"rng": ck.capture_rng_state(), "has_state": True},
               "state": {"step": rep}}
    record, meshes = adapter.write_rank(str(staging_dir_for(final)), rank, sharded, payload)
    records: list = [None] * WORLD
    dist.all_gather_object(records, record)
    if rank == 0:  # the committer's step, as protocol.save takes it
        from rayguard.train import protocol
        from rayguard.train.store import LocalStore

        store, meta = LocalStore(str(root)), {}
        protocol._describe_sharded(store, final, records, meshes, sorted(sharded), WORLD, meta)
        store.commit(final, records, world_size=WORLD, step=rep, metadata=meta)


class _GlooCollective:
    """The one collective call ``load_verified`` makes (a gather to every rank), over gloo."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def gather(self, tag: str, value: object) -> list:
        out: list = [None] * WORLD
        dist.all_gather_object(out, value)
        return out


def _rayguard_load(root: Path, rep: int, rank: int, sharded: dict) -> None:
    """What load_state(sharded=...) does on a local run directory: every rank checks its
    share (sizes of every file, digests of .metadata and the plain shards), then DCP loads
    with each rank verifying the bytes it reads, the ranks agree, and the plain shard is
    read (verified while read)."""
    from rayguard.checkpoint import read_manifest
    from rayguard.checkpoint.sharded import verify_share
    from rayguard.train import sharded as adapter

    final = root / f"checkpoint_{rep:09d}_a0"
    shares: list = [None] * WORLD
    dist.all_gather_object(shares, verify_share(final, rank, WORLD, dcp_data=False).problems)
    if any(shares):
        raise RuntimeError(f"{final} did not verify: {shares}")
    problems, _ = adapter.load_verified(_GlooCollective(rank), str(final), sharded,  # type: ignore[arg-type]
                                     read_manifest(final), f"bench{rep}")
    if problems:
        raise RuntimeError(f"{final} did not verify while loading: {problems}")
    read_shard(final, rank)


def _verify_only(root: Path, rep: int, rank: int) -> None:
    """The separate hashing pass the load used to make before DCP read (every file's share)."""
    from rayguard.checkpoint.sharded import verify_share

    verify_share(root / f"checkpoint_{rep:09d}_a0", rank, WORLD)


def _worker(rank: int, size_mib: int, reps: int, work: str, port: int, out: str,
            threads: int | None) -> None:
    import torch.distributed.checkpoint as dcp

    from rayguard.checkpoint import hashing

    if threads:
        hashing.MAX_HASH_THREADS = threads

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    sharded = make_sharded_state(size_mib, rank)
    root = Path(work)
    times: dict[str, list[float]] = {}
    for rep in range(reps):
        plain = str(root / f"dcp{rep}")
        ops: dict[str, Callable[[], object]] = {
            "dcp.save": partial(dcp.save, sharded, checkpoint_id=plain),
            "rayguard.save": partial(_rayguard_save, root, rep, rank, sharded),
            "dcp.load": partial(dcp.load, sharded, checkpoint_id=plain),
            "rayguard.load+verify": partial(_rayguard_load, root, rep, rank, sharded),
            "rayguard.verify only": partial(_verify_only, root, rep, rank),
        }
        order = list(ops)
        if rep % 2:  # alternate who goes first, so neither always meets the other's write-back
            order = [order[1], order[0], order[3], order[2], order[4]]
        for name in order:
            times.setdefault(name, []).append(_timed(ops[name]))
        if rank == 0:
            print(f"rep {rep}: " + ", ".join(f"{k} {times[k][-1]:.2f}s" for k in ops), flush=True)
            shutil.rmtree(root / f"dcp{rep}", ignore_errors=True)
            shutil.rmtree(root / f"checkpoint_{rep:09d}_a0", ignore_errors=True)
        dist.barrier()
    if rank == 0:
        torch.save(times, out)
    dist.destroy_process_group()


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_sharded(size_mib: int = 512, reps: int = 3, directory: str | None = None,
                threads: int | None = None) -> dict[str, float]:
    """Run the sharded case; prints and returns rank 0's medians (seconds)."""
    import socket

    from rayguard.checkpoint.hashing import default_threads

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tempfile.mkdtemp(prefix="rg-bench-sharded-", dir=directory)
    out = os.path.join(work, "times.pt")
    print(f"sharded state: {size_mib} MiB of DTensors over {WORLD} gloo processes; dir {work}; "
          f"cores {len(os.sched_getaffinity(0))}; hashing threads per process "
          f"{threads or default_threads()}; torch {torch.__version__}; load average "
          f"{_loadavg()}", flush=True)
    try:
        mp.spawn(_worker, args=(size_mib, reps, work, port, out, threads), nprocs=WORLD)
        times = torch.load(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = size_mib * 2**20
    print(f"load average after the run {_loadavg()} (other work on the cores moves the figures)")
    print(f"\n{'operation (rank 0)':<28}{'median s':>10}{'GiB/s':>8}")
    for name, t in med.items():
        print(f"{name:<28}{t:>10.3f}{nbytes / 2**30 / t:>8.2f}")
    print(f"\nrayguard.save / dcp.save               = {med['rayguard.save'] / med['dcp.save']:.2f}x  (target <= 1.15x)")
    print(f"rayguard.load+verify / dcp.load        = {med['rayguard.load+verify'] / med['dcp.load']:.2f}x  (target <= 1.2x)")
    return med
