"""Checkpoints on a remote pyarrow filesystem (S3, GCS, HDFS, or any ``storage_filesystem``).

Object stores have no atomic rename, so the protocol changes shape, not guarantees:

1. each rank writes its shard into a *local* staging directory, hashing while writing, and
   uploads the files into ``<run>/<name>/`` on the remote filesystem;
2. rank 0 writes the manifest last, in one object PUT (atomic on object stores). A directory
   without a readable manifest is invisible to every reader;
3. a reader downloads a candidate (manifest and the shards it needs) to a local temporary
   directory and verifies every byte there before using it, newest first.

Paths here are paths on ``fs`` (``Result.path`` style), never local paths.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from rayguard.checkpoint import safejson
from rayguard.checkpoint.commit import merge_shards
from rayguard.checkpoint.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    ShardRecord,
    check_relative_path,
    library_versions,
    parse_manifest,
)
from rayguard.exceptions import CheckpointCorruptError, CheckpointError

CHECKPOINT_PREFIX = "checkpoint_"


def is_local(fs: Any) -> bool:
    return fs is None or isinstance(fs, pafs.LocalFileSystem)


def _join(*parts: str) -> str:
    return "/".join(p.rstrip("/") for p in parts if p)


def upload_shard(local_dir: str, remote_dir: str, record: ShardRecord, fs: pafs.FileSystem) -> None:
    """Copy the files of ``record`` from ``local_dir`` into ``remote_dir`` on ``fs``."""
    fs.create_dir(remote_dir, recursive=True)
    for f in record.files:
        check_relative_path(f.path)
        if "/" in f.path:  # e.g. the sharded part's dcp/ files
            fs.create_dir(_join(remote_dir, f.path.rsplit("/", 1)[0]), recursive=True)
        try:
            pafs.copy_files(os.path.join(local_dir, f.path), _join(remote_dir, f.path),
                            source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        except OSError as exc:
            raise CheckpointError(
                f"uploading {f.path} ({f.size_bytes} bytes) to {remote_dir} failed: {exc}. Fix: "
                "check the storage credentials, quota and network; earlier checkpoints are "
                "intact") from exc


def commit_remote(remote_dir: str, records: Iterable[ShardRecord], *, world_size: int,
                  step: int | None, metadata: dict[str, Any], fs: pafs.FileSystem) -> str:
    """Write the manifest of the uploaded shards last, in one object (the commit point)."""
    manifest = Manifest(world_size=world_size, step=step, files=merge_shards(records, world_size),
                        created_unix=time.time(), versions=library_versions(), metadata=metadata)
    with fs.open_output_stream(_join(remote_dir, MANIFEST_NAME)) as out:
        out.write(manifest.to_json().encode("utf-8"))
    return remote_dir


@dataclass(frozen=True)
class RemoteCandidate:
    path: str
    step: int | None
    mtime: float
    source: str | None = None
    """The manifest's ``metadata["source"]`` (``"ray.train.report"``: a loop's directory)."""


def list_remote(root: str, fs: pafs.FileSystem) -> list[RemoteCandidate]:
    """Checkpoint directories under ``root``, newest first (manifest step, then time)."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        return []
    out = []
    for info in infos:
        if info.type != pafs.FileType.Directory or not info.base_name.startswith(CHECKPOINT_PREFIX):
            continue
        manifest = fs.get_file_info(_join(info.path, MANIFEST_NAME))
        step, source = None, None
        if manifest.type == pafs.FileType.File:
            try:
                doc = safejson.loads(_manifest_text(info.path, fs), manifest.path,
                                     max_bytes=MAX_MANIFEST_BYTES)
                step = safejson.int_field(doc.get("step"), "step", -safejson.INT64_MAX)
                meta = doc.get("metadata")
                source = meta.get("source") if isinstance(meta, dict) else None
            except (OSError, ValueError, CheckpointCorruptError):
                step = None
        mtime = manifest.mtime.timestamp() if manifest.mtime else 0.0
        out.append(RemoteCandidate(info.path, step if isinstance(step, int) else None, mtime,
                                   source if isinstance(source, str) else None))
    return sorted(out, key=lambda c: (c.step is not None, c.step or 0, c.mtime), reverse=True)


def _manifest_text(remote_dir: str, fs: pafs.FileSystem) -> str:
    path = _join(remote_dir, MANIFEST_NAME)
    try:
        size = fs.get_file_info(path).size
        if size is not None and size > MAX_MANIFEST_BYTES:
            raise CheckpointCorruptError(f"{path}: {size} bytes, over the {MAX_MANIFEST_BYTES}-"
                                         "byte manifest limit; refusing to read it")
        with fs.open_input_stream(path) as f:
            data = f.read() if size is not None else f.read(MAX_MANIFEST_BYTES + 1)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointCorruptError(f"{remote_dir}: {MANIFEST_NAME}: unreadable ({exc})") from None


def download(remote_dir: str, fs: pafs.FileSystem, ranks: Sequence[int] | None = None) -> str:
    """A local copy of the checkpoint (manifest and the files of ``ranks``; all if None).
    The caller removes it (``shutil.rmtree``)."""
    text = _manifest_text(remote_dir, fs)
    manifest = parse_manifest(text, remote_dir)
    local = tempfile.mkdtemp(prefix="rayguard-ckpt-")
    try:
        keep = None if ranks is None else set(ranks)  # a set: 16,384 ranks are not a scan each
        wanted = [f for f in manifest.files if keep is None or f.rank in keep]
        for f in wanted:
            check_relative_path(f.path)
            target = os.path.join(local, f.path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                pafs.copy_files(_join(remote_dir, f.path), target, source_filesystem=fs,
                                destination_filesystem=pafs.LocalFileSystem())
            except (OSError, FileNotFoundError):
                continue  # verification reports the missing file
        with open(os.path.join(local, MANIFEST_NAME), "w", encoding="utf-8") as out:
            out.write(text)
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    return local
