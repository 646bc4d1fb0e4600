"""The commit protocol: ranks write into a staging directory; one process publishes it.

1. every rank: ``write_shard(staging, rank, state)`` (file fsynced, dir fsynced);
2. the committing process (rank 0, after gathering the ShardRecords):
   ``commit(staging, final, records, ...)`` checks each file's size, writes the manifest
   (tmp + fsync + ``os.replace``), fsyncs the staging directory, renames it to ``final``
   (one atomic ``rename(2)`` on a local filesystem) and fsyncs the parent.

A reader accepts only a directory holding a manifest whose files all verify; staging
directories (``.rayguard-staging-*``) are never read and are removed by
:func:`cleanup_staging`. So a crash at any moment leaves either the old set of checkpoints
or the old set plus the new, complete one.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rayguard.checkpoint.fsio import atomic_write_bytes, check_real_dir, fsync_dir, io_error, phase
from rayguard.checkpoint.manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    ShardRecord,
    check_relative_path,
    first_duplicate,
    library_versions,
)
from rayguard.exceptions import CheckpointError

logger = logging.getLogger("rayguard.checkpoint")

STAGING_PREFIX = ".rayguard-staging-"


def staging_dir_for(final_dir: str | os.PathLike[str]) -> Path:
    """The staging directory for ``final_dir``: a hidden sibling, so the rename stays on one filesystem.

    Deterministic, so every rank computes the same path without communicating.
    """
    final = Path(final_dir)
    return final.parent / f"{STAGING_PREFIX}{final.name}"


def prepare_staging(final_dir: str | os.PathLike[str]) -> Path:
    """Create (every rank may call it at once) and return ``final_dir``'s staging directory;
    raises CheckpointError if what is at that name is a symlink or not a directory."""
    staging = staging_dir_for(final_dir)
    try:
        staging.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a file or a dangling link: check_real_dir names it
    except OSError as exc:
        raise io_error("create the staging directory of", staging, exc) from exc
    check_real_dir(staging, "staging directory")
    return staging


def commit(
    staging_dir: str | os.PathLike[str],
    final_dir: str | os.PathLike[str],
    records: Iterable[ShardRecord],
    *,
    world_size: int,
    step: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write the manifest last and publish ``staging_dir`` as ``final_dir`` atomically.

    ``final_dir`` may be any path on the staging directory's filesystem; it must not exist
    or be an empty directory. On failure the staging directory is removed and
    CheckpointError is raised; existing checkpoints are never touched.
    """
    staging, final = Path(staging_dir), Path(final_dir)
    check_real_dir(staging, "staging directory")  # renaming a planted link would publish it
    try:
        manifest = _build_manifest(staging, list(records), world_size, step, metadata or {})
        fsync_dir(staging)
        atomic_write_bytes(staging / MANIFEST_NAME, manifest.to_json().encode("utf-8"))
        phase("manifest-written", staging)
        _publish(staging, final)
    except OSError as exc:
        discard_staging(staging)
        raise io_error("commit", exc.filename or staging, exc) from exc
    except BaseException:
        discard_staging(staging)
        raise
    phase("published", final)
    return final


def merge_shards(records: Iterable[ShardRecord], world_size: int) -> tuple[FileRecord, ...]:
    """Every rank's files, in rank order, for one manifest; O(total files).

    Raises CheckpointError when ``world_size < 1``, when two records share a rank or one
    falls outside ``[0, world_size)``, when two files share a path (the manifest would be
    unreadable: readers refuse a file listed twice) or a path is not a plain relative one.
    Ranks need not all be present (the caller gathered what it commits)."""
    if world_size < 1:
        raise CheckpointError(f"commit(world_size={world_size}): must be >= 1")
    ordered = sorted(records, key=lambda r: r.rank)  # gathered in rank order: one pass
    ranks = [r.rank for r in ordered]
    twice = first_duplicate(ranks)
    outside = [r for r in ranks if not 0 <= r < world_size]
    if twice is not None or outside:
        what = f"rank {twice} twice" if twice is not None else f"ranks {outside[:8]} outside it"
        raise CheckpointError(
            f"commit: shard ranks must be distinct and within world_size {world_size} ({what}, "
            f"{len(ranks)} shards). Fix: gather one ShardRecord per rank of this world")
    files = tuple(f for r in ordered for f in r.files)
    for f in files:
        check_relative_path(f.path)
    duplicate = first_duplicate(f.path for f in files)
    if duplicate is not None:
        owners = [r.rank for r in ordered if any(f.path == duplicate for f in r.files)]
        raise CheckpointError(
            f"commit: {duplicate!r} is claimed by ranks {owners[:8]}; a manifest lists each file "
            "once. Fix: give every rank its own file names (shard_file_name(rank))")
    return files


def _build_manifest(
    staging: Path, records: list[ShardRecord], world_size: int, step: int | None, metadata: dict[str, Any]
) -> Manifest:
    files = merge_shards(records, world_size)
    for f in files:
        actual = (staging / f.path).stat().st_size
        if actual != f.size_bytes:
            raise CheckpointError(
                f"commit: {staging / f.path} is {actual} bytes but its rank reported {f.size_bytes}; "
                "was it rewritten by another save into the same staging directory?"
            )
    return Manifest(
        world_size=world_size,
        step=step,
        files=files,
        created_unix=time.time(),
        versions=library_versions(),
        metadata=metadata,
    )


def _publish(staging: Path, final: Path) -> None:
    try:
        os.rename(staging, final)  # replaces an empty directory atomically; fails if not empty
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise CheckpointError(
                f"commit: {final} already exists and is not empty; refusing to overwrite a "
                "checkpoint. Fix: commit into a new directory name."
            ) from None
        if exc.errno == errno.EXDEV:
            raise CheckpointError(
                f"commit: {staging} and {final} are on different filesystems, so the rename is "
                "not atomic. Fix: stage next to the final directory (staging_dir_for(final))."
            ) from None
        raise
    fsync_dir(final.parent)


def discard_staging(staging_dir: str | os.PathLike[str]) -> None:
    """Remove an abandoned staging directory (after a failed save on any rank)."""
    shutil.rmtree(staging_dir, ignore_errors=True)


def cleanup_staging(root: str | os.PathLike[str]) -> list[Path]:
    """Remove staging directories left under ``root`` by crashed saves; returns them.

    Call at start-up, before any save of this run begins: a staging directory of a save
    still in progress would be removed too.
    """
    removed = []
    try:
        children = list(Path(root).iterdir())
    except FileNotFoundError:
        return []
    for child in children:
        if child.name.startswith(STAGING_PREFIX) and child.is_dir() and not child.is_symlink():
            logger.warning("rayguard: removing %s, left by a checkpoint save that did not finish", child)
            discard_staging(child)
            removed.append(child)
    return removed
