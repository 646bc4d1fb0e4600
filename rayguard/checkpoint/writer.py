"""Write one rank's shard, hashing the bytes while they are written (no second read pass).

The caller's thread writes (``writev`` batches small tensors into one syscall; a large tensor
goes out in one ``write``), while a thread pool hashes every completed 16 MiB chunk of the
same memory; both release the GIL. The file and its directory are fsynced before the
:class:`ShardRecord` is returned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rayguard import runtime
from rayguard.checkpoint import format as fmt
from rayguard.checkpoint.fsio import (
    check_real_dir,
    create_new,
    fsync_dir,
    io_error,
    phase,
    write_all,
)
from rayguard.checkpoint.hashing import StreamHasher, default_threads
from rayguard.checkpoint.manifest import FileRecord, ShardRecord
from rayguard.checkpoint.schemes import current

SMALL_BUFFER_BYTES = 1024 * 1024  # buffers below this are batched into one writev
BATCH_BYTES = 16 * 1024 * 1024


def shard_file_name(rank: int) -> str:
    return f"shard-rank{rank:05d}.safetensors"


class _WriteBatch:
    """Collects small buffers and writes them with one ``writev``; large ones go out at once."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path, self.offset = fd, path, 0
        self._views: list[memoryview] = []
        self._owners: list[object] = []
        self._bytes = 0

    def add(self, view: memoryview, owner: object) -> None:
        if view.nbytes >= SMALL_BUFFER_BYTES:
            self.flush()
            self.offset += write_all(self.fd, [view], self.path, self.offset)
            return
        self._views.append(view)
        self._owners.append(owner)
        self._bytes += view.nbytes
        if self._bytes >= BATCH_BYTES or len(self._views) >= 1024:
            self.flush()

    def flush(self) -> None:
        if self._views:
            self.offset += write_all(self.fd, self._views, self.path, self.offset)
        self._views, self._owners, self._bytes = [], [], 0


def write_shard(
    checkpoint_dir: str | os.PathLike[str], rank: int, state: Any, *, threads: int | None = None,
    scheme: str | None = None,
) -> ShardRecord:
    """Write ``state`` as rank ``rank``'s shard into ``checkpoint_dir`` (usually staging).

    Raises SerializationError for a value that cannot be checkpointed (nothing is written)
    and CheckpointError naming the file and the OS error when the write fails (the partial
    file is removed). ``scheme``: the digest scheme (the process's selection when None).
    """
    scheme = scheme or current()
    directory = Path(checkpoint_dir)
    name = shard_file_name(rank)
    path = directory / name
    structure, entries = fmt.encode(state)
    header = fmt.build_header(structure, entries)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error("write", path, exc) from exc
    check_real_dir(directory, "checkpoint directory")
    try:
        size, digest, chunks = _write_file(path, header, entries, threads, scheme)
    except OSError as exc:
        _remove_quietly(path)
        raise io_error("write", path, exc) from exc
    except BaseException:
        _remove_quietly(path)
        raise
    return ShardRecord(rank=rank, files=(FileRecord(name, rank, size, digest, chunks, scheme),))


def _write_file(
    path: Path, header: bytes, entries: list[fmt.Entry], threads: int | None, scheme: str
) -> tuple[int, str, tuple[str, ...]]:
    fd = create_new(path)
    with runtime.pool(threads or default_threads(), "rg-ckpt-hash") as pool:
        hasher = StreamHasher(pool, scheme=scheme)
        try:
            phase("shard-opened", path)
            batch = _WriteBatch(fd, str(path))
            head = memoryview(header)
            hasher.add(head)
            batch.add(head, header)
            for entry in entries:
                view, owner = fmt.source_buffer(entry)
                hasher.add(view, owner)
                batch.add(view, owner)
            batch.flush()
            os.fsync(fd)
        except BaseException:
            hasher.cancel()
            raise
        finally:
            os.close(fd)
        digest, chunks = hasher.finish()
    fsync_dir(path.parent)
    phase("shard-written", path)
    return hasher.nbytes, digest, chunks


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
