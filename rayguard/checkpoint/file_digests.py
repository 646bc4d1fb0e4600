"""Digests of files on disk, many at once: what ``verify`` and the readers compute to check
a checkpoint (:func:`hash_files`), in the chunked scheme of :mod:`rayguard.checkpoint.hashing`.

Every chunk of every file may hash on a thread pool (hashlib and blake3 release the GIL on a
large buffer). A small file is mostly Python and system calls, which hold the GIL or wait
for the storage: small files are hashed in the caller's thread while that is what they cost
(threads would only take turns), on the pool once they are seen to wait for the storage
(a network filesystem: the pool overlaps the waits). See :class:`Pacer`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from rayguard import runtime
from rayguard.checkpoint.fsio import pread_exact
from rayguard.checkpoint.hashing import (
    IN_FLIGHT_PER_THREAD,
    INLINE_BYTES,
    combine,
    default_threads,
)
from rayguard.checkpoint.schemes import CHUNK_SIZE_BYTES, Hasher, current, factory

_T = TypeVar("_T")
_local = threading.local()  # per thread: each pool thread's read buffer

Result = tuple[str, tuple[str, ...]] | OSError | EOFError
"""A file's (digest, chunk digests), or the error that stopped its read."""
Piece = tuple[int, str, int, int, bool]
"""(file index, path, chunk index, length, whether it ends the file): one chunk to read and
hash."""
READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
"""Never through a link, never blocking on a FIFO swapped in after the caller's stat."""


class SizeChangedError(OSError):
    """A file holds more bytes than the size it is hashed at (written to while read)."""


def _longer(path: str, size: int) -> SizeChangedError:
    return SizeChangedError(f"{path}: longer than its {size} bytes (written to while read)")


def _hash_file_chunk(path: str, index: int, length: int, chunk_size: int,
                     new: Callable[[], Hasher], buf: bytearray | None = None,
                     last: bool = False) -> bytes:
    if buf is None:  # a pool thread's buffer, kept for its next chunks
        buf = getattr(_local, "buf", None)
        if buf is None or len(buf) < chunk_size:
            buf = _local.buf = bytearray(chunk_size)
    view = memoryview(buf)[:length]
    fd = os.open(path, READ_FLAGS)
    try:
        pread_exact(fd, view, index * chunk_size, path)
        if last and os.pread(fd, 1, index * chunk_size + length):
            raise _longer(path, index * chunk_size + length)
    finally:
        os.close(fd)
    h = new()
    h.update(view)
    return h.digest()


def _hash_small(path: str, size: int, new: Callable[[], Hasher]) -> Result:
    """A whole file of one chunk at most (and ``SMALL_FILE_BYTES``): one open and, unless a
    read comes back short, one read (of a byte more than ``size``: a file that grew is an
    error, as one that shrank). Its result, as :func:`hash_files` gives it."""
    try:
        fd = os.open(path, READ_FLAGS)
        try:
            data = os.pread(fd, size + 1, 0)
            while len(data) < size:  # a short read, or the file ended early
                more = os.pread(fd, size + 1 - len(data), len(data))
                if not more:
                    return EOFError(f"{path}: file ended early at byte {len(data)} (truncated)")
                data += more
        finally:
            os.close(fd)
    except OSError as exc:
        return exc
    if len(data) > size:
        return _longer(path, size)
    if not size:  # no chunks: the digest of nothing
        return new().digest().hex(), ()
    chunk = new()
    chunk.update(data)
    raw = chunk.digest()
    whole = new()
    whole.update(raw)
    return whole.digest().hex(), (raw.hex(),)


def hash_files(
    paths: Sequence[str | os.PathLike[str]], *, threads: int | None = None,
    chunk_size: int = CHUNK_SIZE_BYTES, scheme: str | None = None,
    sizes: Sequence[int] | None = None,
) -> list[Result]:
    """Digest several files at once, every chunk of every file in parallel (files of at most
    ``INLINE_BYTES`` in all, such as DCP's ``.metadata`` and small plain shards, in the
    caller's thread: starting the pool's threads cost more than hashing them).

    ``sizes``: each file's size as the caller just found it (``verify`` stats every file
    before it hashes); without it, one stat per file here. A file is read to that size and
    must end there: one that ended early or grew since is an error.

    A file of at most ``SMALL_FILE_BYTES`` (and one chunk) is one piece, read in one call;
    larger ones are cut into chunks. Small pieces go to the pool together (:func:`_batches`: up to ``BATCH_PIECES`` of them, ``INLINE_BYTES`` in all,
    per task), so 65,536 small files are 1,024 tasks, not 65,536.
    At most ``IN_FLIGHT_PER_THREAD`` tasks per thread are queued at a time (in file order),
    so the pool's memory does not grow with the checkpoint's size.
    Returns, per path, (file digest, chunk digests) or the error that stopped its read.
    """
    n_threads = threads or default_threads()
    scheme = scheme or current()
    new = factory(scheme)
    results: list[Result | None] = [None] * len(paths)
    chunks: dict[int, list[bytes]] = {}  # the chunk digests of files read in chunks
    if sizes is None:
        sizes = _sizes(paths, results)  # one stat per file
    small = min(chunk_size, SMALL_FILE_BYTES)

    def pieces() -> Iterator[Piece]:
        for k, p in enumerate(paths):
            size = sizes[k]
            if results[k] is not None:  # could not stat
                continue
            if size <= small:
                yield k, str(p), 0, size, True
                continue
            chunks[k] = []
            n = -(-size // chunk_size)
            for i in range(n):
                if results[k] is not None:  # an earlier chunk's read failed
                    break
                yield k, str(p), i, min(chunk_size, size - i * chunk_size), i == n - 1

    def keep(k: int, result: bytes | Result) -> None:
        if isinstance(result, bytes):
            chunks[k].append(result)
        elif results[k] is None:
            results[k] = result

    if sum(sizes) <= INLINE_BYTES:  # .metadata, small plain shards: no pool to start
        for piece in pieces():
            keep(piece[0], _hash_piece(piece, chunk_size, new, bytearray(piece[3])))
        return _results(results, chunks, scheme)
    window: deque[tuple[list[Piece], Future[list[bytes | Result]]]] = deque()

    def settle() -> None:
        batch, future = window.popleft()
        for (k, *_), result in zip(batch, future.result(), strict=True):
            keep(k, result)

    pacer = Pacer()
    with runtime.pool(n_threads, "rg-hash") as pool:
        for batch in _batches(pieces()):
            if pacer.here and all(_is_small(piece) for piece in batch):
                for (k, *_), result in zip(batch, pacer.run(_hash_pieces, batch, chunk_size, new),
                                           strict=True):
                    keep(k, result)
                continue
            window.append((batch, pool.submit(_hash_pieces, batch, chunk_size, new)))
            if len(window) >= n_threads * IN_FLIGHT_PER_THREAD:
                settle()
        while window:
            settle()
    return _results(results, chunks, scheme)


class Pacer:
    """Where :func:`hash_files` hashes small files: in the caller's thread while they cost CPU
    there, on the pool from when they are seen to wait for the storage.

    A small file's open, read and digests are microseconds of Python that hold the GIL, so
    threads only take turns at them (65,536 page-cached files of a few bytes: 0.60 s on two
    threads, 0.40 s in the caller's); on a network filesystem each waits for the storage,
    and threads overlap the waits. The first ``probe_batches`` batches run here; when
    their wall time is over ``wait_ratio`` times this thread's CPU time, the rest go to the
    pool (a busy machine stretches wall time too, not fourfold but for a heavy load)."""

    def __init__(self, probe_batches: int = 4, wait_ratio: float = 4.0) -> None:
        self.here = True
        """Whether the next batch of small files is hashed in the caller's thread."""
        self._probes, self._ratio = probe_batches, wait_ratio
        self._wall = self._cpu = 0.0

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in this thread, timed while probing."""
        wall, cpu = time.perf_counter(), time.thread_time()
        out = fn(*args)
        if self._probes > 0:
            self._wall += time.perf_counter() - wall
            self._cpu += time.thread_time() - cpu
            self._probes -= 1
            if not self._probes and self._wall > self._ratio * self._cpu:
                self.here = False
        return out


def _is_small(piece: Piece) -> bool:
    """A whole file read in one call (:func:`_hash_small`)."""
    return piece[4] and piece[2] == 0 and piece[3] <= SMALL_FILE_BYTES


def _batches(pieces: Iterable[Piece]) -> Iterator[list[Piece]]:
    """Consecutive pieces, grouped: a group holds at most ``BATCH_PIECES`` pieces of
    ``INLINE_BYTES`` in all, or one larger piece (a whole chunk is a task of its own)."""
    batch: list[Piece] = []
    nbytes = 0
    for piece in pieces:
        if batch and (nbytes + piece[3] > INLINE_BYTES or len(batch) >= BATCH_PIECES):
            yield batch
            batch, nbytes = [], 0
        batch.append(piece)
        nbytes += piece[3]
    if batch:
        yield batch


def _hash_piece(piece: Piece, chunk_size: int, new: Callable[[], Hasher],
                buf: bytearray | None = None) -> bytes | Result:
    """A small file's result, a chunk's raw digest, or the error that stopped its read."""
    _, path, i, length, last = piece
    if _is_small(piece):
        return _hash_small(path, length, new)
    try:
        return _hash_file_chunk(path, i, length, chunk_size, new, buf, last)
    except (OSError, EOFError) as exc:
        return exc


def _hash_pieces(batch: list[Piece], chunk_size: int,
                 new: Callable[[], Hasher]) -> list[bytes | Result]:
    """A pool task: each piece's digest (a small file's result), or its read's error."""
    return [_hash_piece(piece, chunk_size, new) for piece in batch]


def _sizes(paths: Sequence[str | os.PathLike[str]], results: list[Result | None]) -> list[int]:
    """Each file's size; a file that cannot be stat'ed counts 0, its error its result."""
    out = []
    for k, p in enumerate(paths):
        try:
            out.append(os.stat(p).st_size)
        except OSError as exc:
            results[k] = exc
            out.append(0)
    return out


def _results(results: list[Result | None], chunks: dict[int, list[bytes]],
             scheme: str) -> list[Result]:
    out: list[Result] = []
    for k, result in enumerate(results):
        if result is None:
            raw = chunks.get(k, [])
            result = (combine(raw, scheme), tuple(d.hex() for d in raw))
        out.append(result)
    return out


BATCH_PIECES = 64
"""The most pieces in one pool task (so small files still spread over the threads)."""
SMALL_FILE_BYTES = 64 * 1024
"""A file of at most this many bytes (and one chunk) is read whole in one call and hashed at
once: a small file costs an open, a read and a close, and little Python."""
