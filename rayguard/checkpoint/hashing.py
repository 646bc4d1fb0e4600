"""The checkpoint digest: a hash over fixed-size chunks, computed on a thread pool.

A file of ``n`` bytes is cut into consecutive ``CHUNK_SIZE_BYTES`` chunks (the last one
shorter); each chunk gets its own digest, and the file digest is the digest of the
concatenated raw 32-byte chunk digests. An empty file has no chunks and its digest is
``H(b"")``. ``H`` is the manifest's scheme (:mod:`rayguard.checkpoint.schemes`: sha256 or
BLAKE3); every function here takes ``scheme=``, the process's selection when omitted, and
a reader passes the scheme its manifest names. Chunks are independent, so they hash on
several cores at once (hashlib and blake3 release the GIL), both while a shard is written
(here) and while it is read back (:mod:`rayguard.checkpoint.file_digests`); memory stays
bounded by the chunks in flight.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from rayguard.checkpoint.schemes import CHUNK_SIZE_BYTES, Hasher, current, factory

MAX_HASH_THREADS = 16
IN_FLIGHT_PER_THREAD = 4
"""Chunks queued per hashing thread (bounds the futures and buffers
:func:`~rayguard.checkpoint.file_digests.hash_files` holds)."""


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


INLINE_BYTES = 1024 * 1024
"""Files of at most this much in all are hashed in the caller's thread (a pool costs more);
in the pool, pieces smaller than this share a task, up to this much in all."""


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
