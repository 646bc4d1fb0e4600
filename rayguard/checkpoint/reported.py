"""Checkpoints a loop hands to ``ray.train.report(checkpoint=...)``: sealed with a manifest.

A framework's checkpoint directory (Transformers' ``checkpoint-*``, Lightning's ``.ckpt``, a
plain loop's ``torch.save``) is not written by rayguard, so it gets rayguard's manifest in
three pure steps before Ray persists it:

1. every rank that reports a directory hashes it (:func:`hash_directory`);
2. the ranks' records are merged (:func:`merge_records`): a path several ranks wrote with
   the same bytes is listed once; a path written with different bytes by two ranks cannot be
   verified (Ray keeps whichever upload lands last) and is left out, named in the metadata;
3. the lowest reporting rank writes the manifest into its directory (:func:`seal`), so it
   travels with the files to any storage; the other ranks' directories carry none.

The manifest is the same format as rayguard's own checkpoints, with
``metadata["source"] = "ray.train.report"`` so that ``rayguard.train.load_state()`` never
mistakes a framework's files for its own state (:mod:`rayguard.checkpoint.fallback` reads
it). No Ray, no torch.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayguard.checkpoint.file_digests import hash_files
from rayguard.checkpoint.fsio import atomic_write_bytes
from rayguard.checkpoint.manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    ShardRecord,
    library_versions,
)
from rayguard.checkpoint.schemes import current
from rayguard.exceptions import CheckpointError, UnsealableCheckpointError

SOURCE_KEY = "source"
REPORTED_SOURCE = "ray.train.report"
"""``metadata["source"]`` of a manifest sealed around a directory given to ``ray.train.report``."""
CONFLICTS_KEY = "unverified"
"""``metadata["unverified"]``: paths two ranks wrote with different bytes (not in ``files``)."""


def hash_directory(directory: str | os.PathLike[str], rank: int) -> ShardRecord:
    """Every regular file under ``directory`` (a stale manifest excepted), hashed, as rank
    ``rank``'s record. Raises CheckpointError naming the file that cannot be read."""
    root = Path(directory)
    rels: list[str] = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        for name in sorted(names) + [d for d in dirnames if os.path.islink(Path(dirpath) / d)]:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel == MANIFEST_NAME:
                continue
            _refuse_special(full, rel, rank)
            rels.append(rel)
    scheme = current()
    results = hash_files([root / r for r in rels], scheme=scheme)
    files = []
    for rel, result in zip(rels, results, strict=True):
        if isinstance(result, BaseException):
            raise CheckpointError(f"rank {rank}: cannot hash {root / rel} of the checkpoint given "
                                  f"to ray.train.report ({result})")
        digest, chunks = result
        files.append(FileRecord(rel, rank, (root / rel).stat().st_size, digest, chunks, scheme))
    return ShardRecord(rank, tuple(files))


def _refuse_special(full: Path, rel: str, rank: int) -> None:
    """Raise UnsealableCheckpointError unless ``full`` is a regular file (not a link): what
    a manifest seals is only ever the bytes inside the directory, and a link would be
    refused at every resume (it may point anywhere by then)."""
    st = full.lstat()
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        what = f"a symbolic link to {os.readlink(full)!r}"
        fix = (f"copy the file into the directory instead of linking it (shutil.copy2 "
               f"rather than os.symlink), or remove {rel}")
    else:
        what = "not a regular file (a FIFO, socket or device)"
        fix = f"remove {rel} from the directory before reporting it"
    raise UnsealableCheckpointError(
        f"rank {rank}: the checkpoint given to ray.train.report holds {rel}, {what}; rayguard "
        f"seals only regular files, so it cannot be verified at resume. Fix: {fix}")


def merge_records(records: Sequence[ShardRecord | None]) -> tuple[tuple[FileRecord, ...],
                                                                   tuple[str, ...]]:
    """``(files, conflicts)``: one entry per path (the lowest rank's where bytes agree), and the
    paths ranks wrote with different bytes (left out of ``files``)."""
    chosen: dict[str, FileRecord] = {}
    conflicts: set[str] = set()
    for record in sorted((r for r in records if r is not None), key=lambda r: r.rank):
        for f in record.files:
            seen = chosen.get(f.path)
            if seen is None:
                chosen[f.path] = f
            elif (seen.digest, seen.size_bytes) != (f.digest, f.size_bytes):
                conflicts.add(f.path)
    for path in conflicts:
        chosen.pop(path, None)
    return tuple(chosen[p] for p in sorted(chosen)), tuple(sorted(conflicts))


def seal(directory: str | os.PathLike[str], records: Sequence[ShardRecord | None], *,
         world_size: int, step: int | None, metadata: dict[str, Any] | None = None) -> Manifest:
    """Write the merged manifest into ``directory`` (the writer rank's), atomically."""
    files, conflicts = merge_records(records)
    meta = dict(metadata or {})
    meta[SOURCE_KEY] = REPORTED_SOURCE
    if conflicts:
        meta[CONFLICTS_KEY] = list(conflicts)
    manifest = Manifest(world_size=world_size, step=step, files=files, created_unix=time.time(),
                        versions=library_versions(), metadata=meta)
    try:
        atomic_write_bytes(Path(directory) / MANIFEST_NAME, manifest.to_json().encode("utf-8"))
    except OSError as exc:
        raise CheckpointError(f"cannot write {MANIFEST_NAME} into {directory} (the checkpoint "
                              f"given to ray.train.report): {exc}") from None
    return manifest


def drop_stale_manifest(directory: str | os.PathLike[str]) -> None:
    """A non-writer rank's directory must not carry a manifest (one from an earlier
    checkpoint, copied along): it would overwrite the writer's in the persisted checkpoint."""
    try:
        os.unlink(Path(directory) / MANIFEST_NAME)
    except FileNotFoundError:
        pass
