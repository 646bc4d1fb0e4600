"""The checkpoint digest: a hash over fixed-size chunks, computed on a thread pool.

A file of ``n`` bytes is cut into consecutive ``CHUNK_SIZE_BYTES`` chunks (the last one
shorter); each chunk gets its own digest, and the file digest is the digest of the
concatenated raw 32-byte chunk digests. An empty file has no chunks and its digest is
``H(b"")``. ``H`` is the manifest's scheme (:mod:`rayguard.checkpoint.schemes`: sha256 or
BLAKE3); every function here takes ``scheme=``, the process's selection when omitted, and
a reader passes the scheme its manifest names. Chunks are independent, so they hash on
several cores at once (hashlib and blake3 release the GIL), both while a shard is written
and while it is read back; memory stays bounded by the chunks in flight.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from rayguard.checkpoint.fsio import pread_exact
from rayguard.checkpoint.schemes import CHUNK_SIZE_BYTES, Hasher, current, factory

MAX_HASH_THREADS = 16
IN_FLIGHT_PER_THREAD = 4
"""Chunks queued per hashing thread (bounds the futures and buffers :func:`hash_files` holds)."""


def default_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_HASH_THREADS, cores))


def combine(chunk_digests: Sequence[bytes], scheme: str | None = None) -> str:
    """The file digest (hex) from its chunks' raw digests, in file order."""
    h = factory(scheme or current())()
    h.update(b"".join(chunk_digests))
    return h.digest().hex()


def digest_bytes(data: bytes, chunk_size: int = CHUNK_SIZE_BYTES, *,
                 scheme: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(file digest, chunk digests) of an in-memory buffer. Reference implementation."""
    scheme = scheme or current()
    new = factory(scheme)
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    chunks = []
    for i in range(0, len(view), chunk_size):
        h = new()
        h.update(view[i : i + chunk_size])
        chunks.append(h.digest())
    return combine(chunks, scheme), tuple(c.hex() for c in chunks)


def _hash_segments(new: Callable[[], Hasher], segments: list[memoryview],
                   keepalive: list[object]) -> bytes:
    h = new()
    for seg in segments:
        h.update(seg)
    del keepalive  # the tensors behind the segments may be freed from here on
    return h.digest()


class StreamHasher:
    """Hashes a byte stream given as segments, one chunk per pool task.

    ``add(segment, keepalive)`` appends the next bytes of the stream; ``keepalive`` is the
    object that owns the memory (a tensor) and is held until its chunk is hashed. The
    caller must not modify a segment's memory before :meth:`finish` returns.
    """

    def __init__(self, pool: ThreadPoolExecutor, chunk_size: int = CHUNK_SIZE_BYTES, *,
                 scheme: str | None = None) -> None:
        self._pool = pool
        self._chunk_size = chunk_size
        self.scheme = scheme or current()
        self._new = factory(self.scheme)
        self._segments: list[memoryview] = []
        self._keepalive: list[object] = []
        self._filled = 0
        self._futures: list[Future[bytes]] = []
        self._prefix: list[bytes] = []
        self.nbytes = 0

    def hash_prefix(self, view: memoryview) -> tuple[str, ...]:
        """Hash ``view``, the first bytes of the stream, now (on the pool) and return its
        chunks' hex digests, so a caller can compare them before it interprets the bytes.
        ``view`` must end on a chunk boundary unless it ends the stream; nothing may have
        been added before."""
        if self._futures or self._filled or self._prefix:
            raise RuntimeError("hash_prefix must come first")
        size = self._chunk_size
        futures = [self._pool.submit(_hash_segments, self._new, [view[i : i + size]], [])
                   for i in range(0, view.nbytes, size)]
        self._prefix = [f.result() for f in futures]
        self.nbytes += view.nbytes
        return tuple(d.hex() for d in self._prefix)

    def add(self, segment: memoryview, keepalive: object = None) -> None:
        start = 0
        while start < segment.nbytes:
            take = min(segment.nbytes - start, self._chunk_size - self._filled)
            self._segments.append(segment[start : start + take])
            if keepalive is not None:
                self._keepalive.append(keepalive)
            self._filled += take
            start += take
            if self._filled == self._chunk_size:
                self._submit()
        self.nbytes += segment.nbytes

    def _submit(self) -> None:
        segs, keep = self._segments, self._keepalive
        self._segments, self._keepalive, self._filled = [], [], 0
        self._futures.append(self._pool.submit(_hash_segments, self._new, segs, keep))

    def finish(self) -> tuple[str, tuple[str, ...]]:
        """Wait for every chunk; returns (file digest, chunk digests in hex)."""
        if self._filled:
            self._submit()
        raw = self._prefix + [f.result() for f in self._futures]
        return combine(raw, self.scheme), tuple(d.hex() for d in raw)

    def cancel(self) -> None:
        for f in self._futures:
            f.cancel()
        for f in self._futures:
            if not f.cancelled():
                f.exception()  # wait, so no task still reads memory the caller frees


_local = threading.local()


def _hash_file_chunk(path: str, index: int, length: int, chunk_size: int,
                     new: Callable[[], Hasher], buf: bytearray | None = None) -> bytes:
    if buf is None:  # a pool thread's buffer, kept for its next chunks
        buf = getattr(_local, "buf", None)
        if buf is None or len(buf) < chunk_size:
            buf = _local.buf = bytearray(chunk_size)
    view = memoryview(buf)[:length]
    # never through a link, never blocking on a FIFO swapped in after the caller's stat
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        pread_exact(fd, view, index * chunk_size, path)
    finally:
        os.close(fd)
    h = new()
    h.update(view)
    return h.digest()


def hash_files(
    paths: Sequence[str | os.PathLike[str]], *, threads: int | None = None, chunk_size: int = CHUNK_SIZE_BYTES,
    scheme: str | None = None,
) -> list[tuple[str, tuple[str, ...]] | OSError | EOFError]:
    """Digest several files at once, every chunk of every file in parallel (files of at most
    ``INLINE_BYTES`` in all, such as DCP's ``.metadata`` and small plain shards, in the
    caller's thread: starting the pool's threads cost more than hashing them).

    Small pieces go to the pool together (:func:`_batches`: up to ``BATCH_PIECES`` of them,
    ``INLINE_BYTES`` in all, per task), so 65,536 small files are 1,024 tasks, not 65,536.
    At most ``IN_FLIGHT_PER_THREAD`` tasks per thread are queued at a time (in file order),
    so the pool's memory does not grow with the checkpoint's size.
    Returns, per path, (file digest, chunk digests) or the error that stopped its read.
    """
    n_threads = threads or default_threads()
    scheme = scheme or current()
    new = factory(scheme)
    errors: dict[int, OSError | EOFError] = {}
    digests: list[list[bytes]] = [[] for _ in paths]
    sizes = _sizes(paths, errors)  # one stat per file

    def pieces() -> Iterator[Piece]:
        for k, p in enumerate(paths):
            size = sizes[k]
            for i in range(-(-size // chunk_size)):
                yield k, str(p), i, min(chunk_size, size - i * chunk_size)

    def keep(k: int, result: bytes | OSError | EOFError) -> None:
        if isinstance(result, bytes):
            digests[k].append(result)
        else:
            errors.setdefault(k, result)

    if sum(sizes) <= INLINE_BYTES:  # .metadata, small plain shards: no pool to start
        for k, path, i, length in pieces():
            if k not in errors:
                keep(k, _hash_piece(path, i, length, chunk_size, new, bytearray(length)))
        return _results(paths, digests, errors, scheme)
    window: deque[tuple[list[Piece], Future[list[bytes | OSError | EOFError]]]] = deque()

    def settle() -> None:
        batch, future = window.popleft()
        for (k, *_), result in zip(batch, future.result(), strict=True):
            keep(k, result)

    with ThreadPoolExecutor(n_threads, thread_name_prefix="rg-hash") as pool:
        for batch in _batches(p for p in pieces() if p[0] not in errors):
            window.append((batch, pool.submit(_hash_pieces, batch, chunk_size, new)))
            if len(window) >= n_threads * IN_FLIGHT_PER_THREAD:
                settle()
        while window:
            settle()
    return _results(paths, digests, errors, scheme)


Piece = tuple[int, str, int, int]
"""(file index, path, chunk index, length): one chunk to read and hash."""


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


def _hash_piece(path: str, index: int, length: int, chunk_size: int,
                new: Callable[[], Hasher], buf: bytearray | None = None) -> bytes | OSError | EOFError:
    try:
        return _hash_file_chunk(path, index, length, chunk_size, new, buf)
    except (OSError, EOFError) as exc:
        return exc


def _hash_pieces(batch: list[Piece], chunk_size: int,
                 new: Callable[[], Hasher]) -> list[bytes | OSError | EOFError]:
    """A pool task: each piece's digest, or the error that stopped its read."""
    return [_hash_piece(path, i, length, chunk_size, new) for _, path, i, length in batch]


def _sizes(paths: Sequence[str | os.PathLike[str]], errors: dict[int, OSError | EOFError]) -> list[int]:
    """Each file's size; a file that cannot be stat'ed counts 0 and its error goes into
    ``errors`` (its result)."""
    out = []
    for k, p in enumerate(paths):
        try:
            out.append(os.stat(p).st_size)
        except OSError as exc:
            errors[k] = exc
            out.append(0)
    return out


def _results(paths: Sequence[str | os.PathLike[str]], digests: list[list[bytes]],
             errors: dict[int, OSError | EOFError],
             scheme: str) -> list[tuple[str, tuple[str, ...]] | OSError | EOFError]:
    out: list[tuple[str, tuple[str, ...]] | OSError | EOFError] = []
    for k in range(len(paths)):
        if k in errors:
            out.append(errors[k])
        else:
            out.append((combine(digests[k], scheme), tuple(d.hex() for d in digests[k])))
    return out


INLINE_BYTES = 1024 * 1024
"""Files of at most this much in all are hashed in the caller's thread (a pool costs more);
in the pool, pieces smaller than this share a task, up to this much in all."""
BATCH_PIECES = 64
"""The most pieces in one pool task (so small files still spread over the threads)."""


def _update(h: Hasher, view: memoryview) -> None:
    h.update(view)


class WriteHasher:
    """Hashes a stream as it is written, one write at a time, for writers whose buffers are
    valid only during the write call (DCP's ``torch.save`` into a stream).

    :meth:`around` hashes ``view`` on the pool while the caller's ``write`` sends the same
    bytes to the file, and returns only when both are done, so no buffer outlives its call
    and at most one write's bytes are in flight. A chunk that spans writes is one
    incremental hash fed in stream order. ``pool=None`` hashes inline.
    """

    def __init__(self, pool: ThreadPoolExecutor | None, chunk_size: int = CHUNK_SIZE_BYTES, *,
                 scheme: str | None = None) -> None:
        self._pool = pool
        self._chunk_size = chunk_size
        self.scheme = scheme or current()
        self._new = factory(self.scheme)
        self._current = self._new()
        self._filled = 0
        self._done: list[bytes] = []
        self.nbytes = 0

    def around(self, view: memoryview, write: Callable[[], int]) -> int:
        """Run ``write()`` (which writes ``view``) while ``view`` is hashed; returns its result."""
        pieces: list[tuple[Hasher, memoryview]] = []
        finished: list[Hasher] = []
        start = 0
        while start < view.nbytes:
            take = min(view.nbytes - start, self._chunk_size - self._filled)
            pieces.append((self._current, view[start : start + take]))
            self._filled += take
            start += take
            if self._filled == self._chunk_size:
                finished.append(self._current)
                self._current, self._filled = self._new(), 0
        futures = []
        last = pieces.pop() if pieces else None  # hashed by this thread once its write is done
        for h, piece in pieces:
            if self._pool is None or piece.nbytes < INLINE_BYTES:
                h.update(piece)
            else:
                futures.append(self._pool.submit(_update, h, piece))
        try:
            written = write()
            if last is not None:
                last[0].update(last[1])
        finally:
            for f in futures:
                f.result()
        self._done.extend(h.digest() for h in finished)
        self.nbytes += view.nbytes
        return written

    def finish(self) -> tuple[str, tuple[str, ...]]:
        """(file digest, chunk digests in hex) of everything written."""
        raw = self._done + ([self._current.digest()] if self._filled else [])
        return combine(raw, self.scheme), tuple(d.hex() for d in raw)
