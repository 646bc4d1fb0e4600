"""Read a shard back into tensors, verifying size and digest while reading (one pass).

Each tensor is allocated once and filled straight from the file (``readv``); as soon as a
16 MiB chunk of the file has been read, a pool thread hashes the very memory that will be
returned. The state is returned only if every chunk matches the manifest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rayguard import runtime
from rayguard.checkpoint import format as fmt
from rayguard.checkpoint.fsio import read_exact
from rayguard.checkpoint.hashing import CHUNK_SIZE_BYTES, StreamHasher, default_threads
from rayguard.checkpoint.manifest import FileRecord, Manifest, read_manifest, resolve_inside
from rayguard.checkpoint.verify import describe_digest_mismatch
from rayguard.exceptions import CheckpointCorruptError, CheckpointError

logger = logging.getLogger("rayguard.checkpoint")

READ_PIECE_BYTES = 8 * 1024 * 1024
SMALL_BUFFER_BYTES = 1024 * 1024


def shard_rank_for(manifest: Manifest, rank: int, where: str = "checkpoint") -> int:
    """Which saved rank's shard ``rank`` loads: its own, else rank 0's (replicated state)."""
    if manifest.shard_files_of(rank):
        return rank
    if manifest.shard_files_of(0):
        return 0
    raise CheckpointError(
        f"{where} has no shard for rank {rank} and none for rank 0 to fall back on (it holds "
        f"ranks {manifest.ranks} of world size {manifest.world_size}). Fix: save a state on "
        "rank 0 (replicated) or on every rank, or restore with the world size it was saved with."
    )


def read_shard(
    checkpoint_dir: str | os.PathLike[str],
    rank: int,
    *,
    verify: bool = True,
    map_location: str | torch.device | None = None,
    threads: int | None = None,
) -> Any:
    """Rank ``rank``'s state from a committed checkpoint (rank 0's when it saved none).

    With ``verify`` every byte is checked against the manifest's size and digest as it is
    read; a mismatch raises CheckpointCorruptError naming the file and byte range.
    Tensors are returned on the CPU unless ``map_location`` names a device.
    """
    directory = Path(checkpoint_dir)
    manifest = read_manifest(directory)
    source = shard_rank_for(manifest, rank, str(directory))
    if source != rank:
        logger.info("rank %d loads rank %d's (replicated) shard from %s", rank, source, directory)
    files = manifest.shard_files_of(source)
    if len(files) != 1:
        raise CheckpointCorruptError(f"{directory}: rank {source} has {len(files)} files; expected 1")
    path = resolve_inside(directory, files[0].path)
    state = read_shard_file(path, files[0] if verify else None, threads=threads)
    return state if map_location is None else _to_device(state, torch.device(map_location))


def read_shard_file(path: Path, record: FileRecord | None, *, threads: int | None = None) -> Any:
    """Load one shard file; verify it against ``record`` (size, digest) unless it is None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path}: shard file is missing") from None
    try:
        size = os.fstat(fd).st_size
        _check_size(size, record, str(path), " (truncated or overwritten after the save)")
        structure, objects = _hashed(record, str(path), threads,
                                     lambda hasher: _read_payload(fd, path, size, hasher, record))
    except (OSError, EOFError) as exc:
        raise CheckpointCorruptError(f"{path}: could not read the shard ({exc})") from None
    finally:
        os.close(fd)
    return _decode(structure, objects, str(path))


def _check_size(size: int, record: FileRecord | None, where: str, why: str = "") -> None:
    if record is not None and size != record.size_bytes:
        raise CheckpointCorruptError(
            f"{where}: size is {size} bytes, the manifest says {record.size_bytes}{why}")


def _hashed(record: FileRecord | None, where: str, threads: int | None,
            fill: Callable[[StreamHasher | None], tuple[Any, list[Any]]]) -> tuple[Any, list[Any]]:
    """Run ``fill(hasher)`` (it reads the shard into fresh tensors, adding every byte to the
    hasher) and check the digest against ``record``; no hashing when ``record`` is None."""
    with runtime.pool(threads or default_threads(), "rg-ckpt-hash") as pool:
        hasher = StreamHasher(pool, scheme=record.scheme) if record is not None else None
        try:
            structure, objects = fill(hasher)
        except BaseException:
            if hasher is not None:
                hasher.cancel()
            raise
        if hasher is not None and record is not None:
            digest, chunks = hasher.finish()
            if digest != record.digest:
                raise CheckpointCorruptError(f"{where}: {describe_digest_mismatch(record, digest, chunks)}")
    return structure, objects


def _decode(structure: Any, objects: list[Any], where: str) -> Any:
    try:
        return fmt.decode(structure, objects)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RuntimeError,
            OverflowError, RecursionError) as exc:
        raise CheckpointCorruptError(f"{where}: shard structure is invalid ({type(exc).__name__}: "
                                     f"{str(exc)[:300]})") from None


def _header_length(prefix: bytes | bytearray | memoryview, size: int, where: str) -> int:
    n = int.from_bytes(prefix, "little") if size >= 8 else -1
    if n < 0 or n > fmt.MAX_HEADER_BYTES or 8 + n > size:
        raise CheckpointCorruptError(f"{where}: shard header length {n} is impossible for a {size}-byte file (corrupt)")
    return n


def _head_end(header_end: int, size: int, hasher: StreamHasher | None) -> int:
    """Where the first read stops: the header's end, or (when hashing) the end of the chunk
    holding it, so the header's chunks are compared before it is parsed."""
    if hasher is None:
        return header_end
    return min(size, -(-header_end // CHUNK_SIZE_BYTES) * CHUNK_SIZE_BYTES)


def _check_head(hasher: StreamHasher | None, head: memoryview, record: FileRecord | None,
                where: str) -> None:
    """Compare the chunks holding the header with the manifest before the header is parsed
    (a forged header costs its size in memory, not the many times that of parsing it)."""
    if hasher is None or record is None:
        return
    got = hasher.hash_prefix(head)
    n_chunks = -(-record.size_bytes // CHUNK_SIZE_BYTES)
    if len(record.chunk_digests) != n_chunks:
        raise CheckpointCorruptError(
            f"{where}: the manifest lists {len(record.chunk_digests)} chunk digests for a file "
            f"of {n_chunks} chunks (the manifest is corrupt)")
    if tuple(record.chunk_digests[: len(got)]) != got:
        mismatch = describe_digest_mismatch(record, "", got)
        raise CheckpointCorruptError(f"{where}: {mismatch}, in the chunks holding the shard "
                                     "header (not parsed)")


def _read_payload(fd: int, path: Path, size: int, hasher: StreamHasher | None,
                  record: FileRecord | None) -> tuple[Any, list[Any]]:
    prefix = bytearray(8)
    read_exact(fd, [memoryview(prefix)], str(path))
    n = _header_length(prefix, size, str(path))
    head_end = _head_end(8 + n, size, hasher)
    head = bytearray(head_end)
    head[:8] = prefix
    read_exact(fd, [memoryview(head)[8:]], str(path))
    _check_head(hasher, memoryview(head), record, str(path))
    structure, entries, _ = fmt.parse_header(bytes(head[8 : 8 + n]), size, str(path))
    objects: list[Any] = []
    small: list[tuple[memoryview, object]] = []
    pos = 8 + n
    for entry in entries:
        obj, view = _allocate(entry, str(path))
        objects.append(obj)
        in_head = max(0, min(view.nbytes, head_end - pos))  # read and hashed with the header
        if in_head:
            view[:in_head] = head[pos : pos + in_head]
        pos += view.nbytes
        view = view[in_head:]
        if view.nbytes < SMALL_BUFFER_BYTES:
            if view.nbytes:
                small.append((view, obj))
            if len(small) >= 1024:
                _read_small(fd, path, small, hasher)
            continue
        _read_small(fd, path, small, hasher)
        for start in range(0, view.nbytes, READ_PIECE_BYTES):
            piece = view[start : start + READ_PIECE_BYTES]
            read_exact(fd, [piece], str(path))
            if hasher is not None:
                hasher.add(piece, obj)
    _read_small(fd, path, small, hasher)
    return structure, objects


def _allocate(entry: fmt.Entry, where: str) -> tuple[Any, memoryview]:
    try:
        return fmt.allocate(entry)
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise CheckpointCorruptError(f"{where}: cannot allocate tensor of dtype {entry.dtype} "
                                     f"and shape {entry.shape} ({str(exc)[:200]})") from None


def _read_small(fd: int, path: Path, small: list[tuple[memoryview, object]], hasher: StreamHasher | None) -> None:
    if not small:
        return
    read_exact(fd, [v for v, _ in small], str(path))
    if hasher is not None:
        for view, obj in small:
            hasher.add(view, obj)
    small.clear()


def _to_device(state: Any, device: torch.device) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _to_device(v, device) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        items = [_to_device(v, device) for v in state]
        return items if isinstance(state, list) else tuple(items)
    return state


def read_shard_bytes(data: Any, record: FileRecord | None, where: str, *,
                     threads: int | None = None) -> Any:
    """Load one shard from memory (``data``: bytes or a uint8 buffer holding the whole file),
    with the same checks and the same decoder as :func:`read_shard_file`: the chunks holding
    the header are compared with ``record`` before it is parsed, and every other byte is
    hashed (against ``record`` unless it is None) while it is copied into freshly allocated
    tensors, so the state returned never shares memory with ``data``. Raises
    CheckpointCorruptError for any bytes that are not the manifest's shard."""
    try:
        buf = memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise CheckpointCorruptError(f"{where}: not a byte buffer ({exc})") from None
    size = buf.nbytes
    _check_size(size, record, where)
    n = _header_length(buf[:8], size, where)

    def fill(hasher: StreamHasher | None) -> tuple[Any, list[Any]]:
        head_end = _head_end(8 + n, size, hasher)
        _check_head(hasher, buf[:head_end], record, where)
        structure, entries, offset = fmt.parse_header(bytes(buf[8 : 8 + n]), size, where)
        objects: list[Any] = []
        for entry in entries:
            obj, view = _allocate(entry, where)
            view[:] = buf[offset : offset + entry.nbytes]
            in_head = max(0, min(entry.nbytes, head_end - offset))
            offset += entry.nbytes
            objects.append(obj)
            if hasher is not None and view.nbytes > in_head:
                hasher.add(view[in_head:], obj)
        return structure, objects

    structure, objects = _hashed(record, where, threads, fill)
    return _decode(structure, objects, where)
