"""The sharded part of a checkpoint: the files torch.distributed.checkpoint (DCP) wrote.

A checkpoint taken with ``report(sharded=...)`` holds, beside each rank's plain shard
(``shard-rankNNNNN.safetensors``: the plain ``state=`` part and the rank's RNG), a ``dcp/``
directory written by ``torch.distributed.checkpoint.save``: ``__<rank>_<n>.distcp`` per rank
and one ``.metadata`` (written by rank 0). Every one of those files is listed in the rayguard
manifest with its size and digest like any shard file, so verification, fallback and the
rejection record are the ones of every checkpoint. The manifest's ``metadata["sharded"]``
(:func:`describe_sharded`) names the format, the directory, the world size that saved it,
the device meshes and the top-level keys.

Pure: no torch.distributed here (the DCP adapter is :mod:`rayguard.train.sharded`).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rayguard import runtime
from rayguard.checkpoint.dcp_layout import (
    DCP_DIR,
    DCP_METADATA,
    SHARDED_FORMAT,
    SHARDED_KEY,
    files_of_rank,
    owner_of,
)
from rayguard.checkpoint.file_digests import hash_files
from rayguard.checkpoint.manifest import FileRecord, Manifest
from rayguard.checkpoint.schemes import current
from rayguard.checkpoint.verify import VerifyReport, verify
from rayguard.exceptions import CheckpointError


def unclaimed(names: Iterable[str], world_size: int) -> list[str]:
    """Files in the DCP directory that no rank of ``world_size`` claims (never committed
    silently: a file nobody hashed would escape verification)."""
    out = []
    for n in names:
        owner = owner_of(n)
        if owner is None or not 0 <= owner < world_size:
            out.append(n)
    return sorted(out)


def record_dcp_files(checkpoint_dir: str | os.PathLike[str], rank: int, *,
                     threads: int | None = None, fsync: bool = True,
                     digests: Mapping[str, tuple[int, str, tuple[str, ...]]] | None = None,
                     scheme: str | None = None) -> tuple[FileRecord, ...]:
    """The records of the DCP files ``rank`` wrote under ``checkpoint_dir/dcp`` (after
    ``dcp.save`` returned on this rank); they go into the manifest like a shard's.

    ``digests``: name -> (size, digest, chunk digests) of the files hashed while they were
    written (:class:`~rayguard.checkpoint.dcp_writer.HashingWriter`); a file among them whose
    size on disk is the one written is recorded from them, any other (``.metadata``, or
    every file without ``digests``) is read and hashed here.
    ``fsync``: also make them durable (and the directory), in a thread beside the hashing
    (the adapter runs DCP with ``sync_files=False`` for that reason).
    ``scheme``: the digest scheme (the process's selection when None); ``digests`` must be
    in it (the :class:`~rayguard.checkpoint.dcp_writer.HashingWriter`'s ``scheme``)."""
    scheme = scheme or current()
    directory = Path(checkpoint_dir) / DCP_DIR
    names = files_of_rank(os.listdir(directory), rank)
    paths = [directory / n for n in names]
    try:
        sizes = [p.stat().st_size for p in paths]
    except OSError as exc:
        raise CheckpointError(f"rank {rank}: could not stat a DCP file after the save ({exc})") from exc
    known = dict(digests or {})
    streamed = {n: known[n] for n, size in zip(names, sizes, strict=True)
                if n in known and known[n][0] == size}
    to_hash = [p for n, p in zip(names, paths, strict=True) if n not in streamed]
    with runtime.pool(1, "rg-dcp-fsync") as pool:
        synced = pool.submit(_fsync_all, [*paths, directory]) if fsync else None
        hashed = dict(zip(to_hash, hash_files(to_hash, threads=threads, scheme=scheme), strict=True)) if to_hash else {}
        if synced is not None:
            synced.result()
    records = []
    for name, path, size in zip(names, paths, sizes, strict=True):
        if name in streamed:
            records.append(FileRecord(f"{DCP_DIR}/{name}", rank, size, *streamed[name][1:],
                                      scheme=scheme))
            continue
        result = hashed[path]
        if isinstance(result, BaseException):
            raise CheckpointError(f"rank {rank}: could not hash {path} after the DCP save ({result})")
        records.append(FileRecord(f"{DCP_DIR}/{name}", rank, size, result[0],
                                  result[1], scheme))
    return tuple(records)


def _fsync_all(paths: Sequence[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_complete(records: Sequence[FileRecord], listing: Iterable[str], world_size: int) -> None:
    """The committer's check that the manifest will cover the DCP directory exactly.

    ``records`` are every rank's DCP file records, ``listing`` the names in the staging DCP
    directory. Raises CheckpointError if a file is unclaimed, unrecorded, or ``.metadata`` is
    missing.
    """
    recorded = {r.path.removeprefix(f"{DCP_DIR}/") for r in records}
    names = set(listing)
    problems = []
    strangers = unclaimed(names, world_size)
    if strangers:
        problems.append(f"files no rank wrote {strangers[:5]}")
    missing = sorted(names - recorded - set(strangers))
    if missing:
        problems.append(f"files written but not hashed {missing[:5]}")
    if DCP_METADATA not in names:
        problems.append(f"no {DCP_METADATA} (DCP's save did not finish)")
    if problems:
        raise CheckpointError(
            "the sharded part cannot be committed: " + "; ".join(problems)
            + ". Fix: nothing else may write into a checkpoint's dcp/ directory while it is saved.")


def describe_sharded(world_size: int, meshes: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """The manifest's ``metadata["sharded"]`` entry."""
    unique: list[dict[str, Any]] = []
    for mesh in meshes:
        if mesh not in unique:
            unique.append(dict(mesh))
    return {"format": SHARDED_FORMAT, "dir": DCP_DIR, "world_size": int(world_size),
            "meshes": unique, "keys": sorted(keys)}


def sharded_info(manifest: Manifest) -> dict[str, Any] | None:
    """The sharded part's description, or None when the checkpoint has none."""
    info = manifest.metadata.get(SHARDED_KEY)
    return info if isinstance(info, dict) else None


def check_loadable(manifest: Manifest, where: str) -> dict[str, Any]:
    """The sharded description of a checkpoint that ``load_state(sharded=...)`` will read;
    raises CheckpointError when it has no sharded part or its manifest does not list DCP's
    ``.metadata`` (so DCP would read a file nobody verified)."""
    info = sharded_info(manifest)
    if info is None or info.get("format") != SHARDED_FORMAT:
        raise CheckpointError(
            f"{where} holds no sharded state (it was saved with state= only). Fix: load it with "
            "load_state() and the plain state's tensors, or start a new run directory for the "
            "sharded model.")
    listed = {f.path for f in manifest.files}
    if f"{DCP_DIR}/{DCP_METADATA}" not in listed:
        raise CheckpointError(f"{where}: its manifest lists no {DCP_DIR}/{DCP_METADATA}; refusing "
                              "to let DCP read files that were not verified")
    return info


def plan_verification(manifest: Manifest, world_size: int) -> list[list[str]]:
    """Which files each of ``world_size`` loading ranks hashes, so that together they hash
    every file once. At the saved world size each rank hashes what its own rank saved (the
    files it mostly reads, so they are in its page cache when DCP reads them); at another
    size the files go largest first to the least loaded rank (ties: the lowest rank), picked
    from a heap: O(files log world_size), where a scan of every rank per file took
    65,536 x 16,384 steps on every loading rank."""
    plan: list[list[str]] = [[] for _ in range(world_size)]
    if manifest.world_size == world_size:
        for f in manifest.files:
            plan[f.rank].append(f.path)
        return plan
    loads = [(0, r) for r in range(world_size)]  # (bytes so far, rank): already a heap
    for f in sorted(manifest.files, key=lambda f: (-f.size_bytes, f.path)):
        load, r = loads[0]
        plan[r].append(f.path)
        heapq.heapreplace(loads, (load + f.size_bytes, r))
    return plan


def verify_share(checkpoint_dir: str | os.PathLike[str], rank: int, world_size: int, *,
                 threads: int | None = None, dcp_data: bool = True) -> VerifyReport:
    """Rank ``rank``'s share of verifying a checkpoint (:func:`plan_verification`): every
    file's presence and size, and the digests of this rank's files. The checkpoint is whole
    when every rank's report is ok. ``dcp_data=False``: the DCP data files are left out of
    the hashing (sizes still checked), for a load that verifies them as it reads them
    (:mod:`rayguard.checkpoint.dcp_verified_read`); ``.metadata`` and the plain shards are
    hashed as before."""
    def share(m: Manifest) -> list[str]:
        mine = plan_verification(m, world_size)[rank]
        return mine if dcp_data else [p for p in mine if not is_dcp_data(p)]

    return verify(checkpoint_dir, threads=threads, only=share)


def is_dcp_data(rel_path: str) -> bool:
    """Whether a manifest path is one of DCP's data files (``dcp/__<rank>_<n>.distcp``)."""
    return rel_path.startswith(f"{DCP_DIR}/") and rel_path != f"{DCP_DIR}/{DCP_METADATA}"


def find_distributed_tensors(state: Any, where: str = "state", limit: int = 5) -> list[str]:
    """Paths of DTensor values in ``state`` (plain ``state=`` cannot hold them)."""
    found: list[str] = []
    _walk(state, where, found, limit)
    return found


def _walk(obj: Any, where: str, found: list[str], limit: int) -> None:
    if len(found) >= limit:
        return
    if _is_dtensor(obj):
        found.append(where)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{where}[{k!r}]", found, limit)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{where}[{i}]", found, limit)


def _is_dtensor(obj: Any) -> bool:
    return any(c.__name__ == "DTensor" and c.__module__.startswith("torch.distributed")
               for c in type(obj).__mro__)


def dtensor_error_message(paths: Sequence[str], rank: int) -> str:
    return (f"rank {rank}: {', '.join(paths)} is a DTensor (FSDP2 / tensor-parallel shard). "
            "Plain state= holds only whole tensors, so a sharded model cannot go through it. "
            "Fix: pass the model and optimizer as sharded={'model': model, 'optim': opt} on "
            "every rank (written with torch.distributed.checkpoint, reshardable), and keep "
            "state= for plain values such as the step.")
