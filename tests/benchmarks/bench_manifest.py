"""Checkpoint commit at scale: the manifest of N ranks x F files (default 4: a rank's plain
shard and three DCP data files), from the committer's merge to ``rayguard checkpoint verify``.

Per N (``--ranks``, default 1024 and 16384) one JSON line, seconds (best of ``--repeat``):

- ``merge_s``: :func:`~rayguard.checkpoint.commit.merge_shards` of the gathered records
  (pure, in memory: rank order, distinct ranks, each path once);
- ``to_json_s`` / ``to_json_keyed_s``: the manifest text, without / with a checkpoint key;
- ``commit_s``: :func:`~rayguard.checkpoint.commit.commit` of a staging directory of tiny
  files (the merge, a stat per file, the manifest written and fsynced, the rename);
- ``json_s``: plain ``json.loads`` of the manifest (the floor); ``safejson_s``: the bounded
  parser the checkpoint code reads it with (:mod:`rayguard.checkpoint.safejson`);
- ``parse_s`` / ``parse_keyed_s``: :func:`~rayguard.checkpoint.manifest.parse_manifest`
  (the parser, every entry checked, the consistency checks; keyed: the keyed digest too);
- ``structure_s``: ``verify(hashes=False)``: read, parse, every path resolved inside the
  checkpoint and every file's type and size (no file contents read);
- ``verify_s``: ``verify()`` in this process: the above and every file hashed (65,536
  small files: opening them is I/O, not manifest work);
- ``cli_s``: ``python -m rayguard checkpoint verify PATH`` as a user runs it (interpreter
  start and imports included; ``cli_start_s`` is the same command on a missing path).

Each figure ``X_s`` (wall) comes with ``X_cpu_s`` (CPU seconds of the process doing it: on a
shared machine the steadier of the two).

Then one line with the growth from the smallest N to the largest of each figure (files
grow by ``growth_files``: linear work grows by about that much). No figure fails anything.

    .venv/bin/python tests/benchmarks/bench_manifest.py [--ranks 1024 16384] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayguard.checkpoint import auth, safejson
from rayguard.checkpoint.hashing import digest_bytes
from rayguard.checkpoint.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    FileRecord,
    Manifest,
    ShardRecord,
    parse_manifest,
)
from rayguard.checkpoint.schemes import current
from rayguard.checkpoint.verify import verify

commit_mod = importlib.import_module("rayguard.checkpoint.commit")  # the package re-exports commit()


def file_names(rank: int, per_rank: int) -> list[str]:
    """A rank's files as a sharded save names them: its plain shard, then DCP data files."""
    return [f"shard-rank{rank:05d}.safetensors"] + [f"dcp/__{rank}_{k}.distcp"
                                                    for k in range(per_rank - 1)]


def build(staging: Path, ranks: int, per_rank: int) -> list[ShardRecord]:
    """Write every rank's tiny files into ``staging``; their records, as gathered."""
    scheme = current()
    (staging / "dcp").mkdir(parents=True, exist_ok=True)
    records = []
    for rank in range(ranks):
        files = []
        for rel in file_names(rank, per_rank):
            data = f"{rank}:{rel}\n".encode()
            (staging / rel).write_bytes(data)
            digest, chunks = digest_bytes(data, scheme=scheme)
            files.append(FileRecord(rel, rank, len(data), digest, chunks, scheme))
        records.append(ShardRecord(rank, tuple(files)))
    return records


Timing = tuple[float, float]
"""(wall seconds, CPU seconds of this process): the CPU figure holds still on a shared
machine, the wall one includes waiting for the disk and for other processes."""


def once(fn: Callable[[], Any]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return round(time.perf_counter() - wall, 4), round(time.process_time() - cpu, 4)


def best(fn: Callable[[], Any], repeat: int) -> Timing:
    runs = [once(fn) for _ in range(repeat)]
    return min(w for w, _ in runs), min(c for _, c in runs)


def timed_commit(staging: Path, final: Path, records: list[ShardRecord], ranks: int,
                 repeat: int) -> Timing:
    """Commit ``repeat`` times (moving the checkpoint back into staging in between); best."""
    runs = []
    for i in range(repeat):
        runs.append(once(lambda: commit_mod.commit(staging, final, records, world_size=ranks,
                                                   step=1)))
        if i + 1 < repeat:
            os.rename(final, staging)
            os.unlink(staging / MANIFEST_NAME)
    return min(w for w, _ in runs), min(c for _, c in runs)


def cli(path: Path) -> tuple[float, float, int]:
    """(wall, the child's CPU seconds, exit status) of ``rayguard checkpoint verify PATH``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rayguard", "checkpoint", "verify", str(path)],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return round(wall, 4), round(cpu, 4), proc.returncode


def put(out: dict[str, Any], name: str, timing: Timing | None) -> None:
    out[f"{name}_s"], out[f"{name}_cpu_s"] = timing if timing is not None else (None, None)


def keyed(fn: Callable[[], Any]) -> Any:
    auth.use(auth.Key(b"bench-manifest-key-0123456789abcdef", "bench"))
    try:
        return fn()
    finally:
        auth.use(None)


def measure(ranks: int, per_rank: int, repeat: int, work: Path, with_cli: bool) -> dict[str, Any]:
    staging = work / f".rayguard-staging-checkpoint_{ranks}"
    final = work / f"checkpoint_{ranks}"
    records = build(staging, ranks, per_rank)
    merge = getattr(commit_mod, "merge_shards", None)
    out: dict[str, Any] = {"ranks": ranks, "files": ranks * per_rank}
    put(out, "merge", best(lambda: merge(records, ranks), repeat) if merge else None)
    manifest = Manifest(world_size=ranks, step=1, files=tuple(f for r in records for f in r.files))
    gc.collect()
    gc.freeze()  # the bench's own records are not what a verifying process holds: keep them
    #              out of the collector's passes, which would otherwise grow with N
    put(out, "to_json", best(manifest.to_json, repeat))
    put(out, "to_json_keyed", keyed(lambda: best(manifest.to_json, repeat)))
    put(out, "commit", timed_commit(staging, final, records, ranks, repeat))
    text = (final / MANIFEST_NAME).read_bytes()
    signed = keyed(manifest.to_json).encode()
    out["manifest_bytes"] = len(text)
    put(out, "json", best(lambda: json.loads(text), repeat))
    put(out, "safejson", best(lambda: safejson.loads(text, "bench", max_bytes=MAX_MANIFEST_BYTES),
                              repeat))
    put(out, "parse", best(lambda: parse_manifest(text, "bench"), repeat))
    put(out, "parse_keyed", keyed(lambda: best(lambda: parse_manifest(signed, "bench"), repeat)))
    put(out, "structure", best(lambda: verify(final, hashes=False), repeat))
    report = verify(final)
    out["verify_ok"] = report.ok and report.files_hashed == ranks * per_rank
    put(out, "verify", best(lambda: verify(final), repeat))
    if with_cli:
        out["cli_start_s"], out["cli_start_cpu_s"], _ = cli(work / "missing")
        runs = [cli(final) for _ in range(repeat)]
        out["cli_s"], out["cli_cpu_s"] = min(r[0] for r in runs), min(r[1] for r in runs)
        out["cli_rc"] = runs[-1][2]
    shutil.rmtree(final, ignore_errors=True)
    gc.unfreeze()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--files-per-rank", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cli", action="store_true", help="skip the `rayguard checkpoint "
                                                               "verify` subprocess")
    parser.add_argument("--dir", default=None, help="where the checkpoints are written "
                                                    "(default: the system temp directory)")
    args = parser.parse_args()
    if args.files_per_rank < 1 or min(args.ranks) < 1:
        parser.error("--ranks and --files-per-rank must be >= 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayguard-bench-manifest-", dir=args.dir) as tmp:
        for ranks in sorted(args.ranks):
            rows.append(measure(ranks, args.files_per_rank, args.repeat, Path(tmp),
                                not args.no_cli))
            print(json.dumps(rows[-1]), flush=True)
    if len(rows) > 1:
        low, high = rows[0], rows[-1]
        growth: dict[str, Any] = {"growth": f"{low['ranks']} -> {high['ranks']} ranks",
                                  "growth_files": round(high["files"] / low["files"], 2)}
        for name, value in low.items():
            if name.endswith("_s") and value and high.get(name) is not None:
                growth[name] = round(high[name] / value, 2)
        print(json.dumps(growth))


if __name__ == "__main__":
    main()
