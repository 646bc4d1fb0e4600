"""DCP's read path with every byte verified before it reaches the state (no separate pass).

``dcp.load`` asks each rank's storage reader for the byte ranges (items) its plan needs,
possibly only part of each data file. :class:`VerifyingReader` reads those ranges widened
to whole 16 MiB chunks of the file, hashes each chunk on a thread pool (reading and hashing
in the pool's threads: both release the GIL), and compares it with the manifest's chunk
digest **before** any item in it is decoded or copied into a tensor of the state; a
mismatch raises CheckpointCorruptError naming the file and byte range, and no byte of that
chunk is used. The manifest's chunk digests are bound to its file digest (checked first),
so what is compared is what the commit recorded.

Memory stays bounded: the ranges are grouped into segments of whole chunks
(:func:`plan_segments`, at most ``SEGMENT_BYTES`` unless one item alone is larger), and at
most two segments are in flight (the one served, the next one being read and hashed).
Their buffers are reused from segment to segment and file to file (:class:`_Buffers`):
the first touch of fresh memory (the kernel zeroing and mapping it) cost more than the
read itself, so a load faults in about two segments' worth, in huge pages
(:mod:`rayguard.checkpoint.readbuf`), whatever the size of the checkpoint.

Only the bytes this rank's plan needs are verified here; a chunk no rank reads is not
hashed by the load (it influences nothing that was loaded); ``rayguard checkpoint verify``
still hashes every byte. How the ranks agree on the outcome: :mod:`rayguard.train.sharded`.

Imports torch: import it lazily.
"""

from __future__ import annotations

import io
import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index  # as DCP's own reader
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future as TorchFuture

from rayguard import runtime
from rayguard.checkpoint.dcp_layout import DCP_DIR
from rayguard.checkpoint.dcp_safe import SafeReader
from rayguard.checkpoint.fsio import pread_exact
from rayguard.checkpoint.hashing import combine, default_threads
from rayguard.checkpoint.manifest import FileRecord, Manifest, resolve_inside
from rayguard.checkpoint.readbuf import read_buffer
from rayguard.checkpoint.schemes import CHUNK_SIZE_BYTES, Hasher, factory, short_name
from rayguard.checkpoint.verify import Problem
from rayguard.exceptions import CheckpointCorruptError

SEGMENT_BYTES = 32 * 1024 * 1024
"""The most bytes one segment reads (unless a single item is larger). Every chunk of a
segment is verified before any item in it is used, and two segments' buffers are what a
load allocates: smaller segments fault in less fresh memory and let the copy into the
state overlap the next segment's reads sooner."""


@dataclass(frozen=True)
class Segment:
    """Chunks ``[first, end)`` of a file, read and verified together, and the items (indices
    into the ranges given to :func:`plan_segments`) served from them, in file order."""

    first: int
    end: int
    items: tuple[int, ...]


def _chunk_span(offset: int, length: int, chunk_size: int) -> tuple[int, int]:
    first = offset // chunk_size
    return first, max(first, -(-(offset + length) // chunk_size))


def plan_segments(ranges: Sequence[tuple[int, int]], *, chunk_size: int = CHUNK_SIZE_BYTES,
                  max_bytes: int | None = None) -> list[Segment]:
    """Group byte ranges ``(offset, length)`` into segments of whole chunks, in file order.

    Ranges sharing a chunk go into one segment while it stays within ``max_bytes``; a range
    that does not fit starts the next one (re-reading the shared chunk, at most one per
    segment). A chunk no range touches is never in a segment. ``max_bytes``: default
    :data:`SEGMENT_BYTES`."""
    max_bytes = SEGMENT_BYTES if max_bytes is None else max_bytes
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1], i))
    limit = max(1, max_bytes // chunk_size)
    out: list[Segment] = []
    first = end = 0
    items: list[int] = []
    for i in order:
        lo, hi = _chunk_span(*ranges[i], chunk_size)
        if items and lo <= end and (hi <= end or hi - first <= limit):
            end = max(end, hi)
            items.append(i)
            continue
        if items:
            out.append(Segment(first, end, tuple(items)))
        first, end, items = lo, hi, [i]
    if items:
        out.append(Segment(first, end, tuple(items)))
    return out


HOT_PIECE_BYTES = 1024 * 1024
"""A chunk is read and hashed this much at a time, so the hash reads what ``pread`` has just
written while it is still in the core's cache instead of from memory."""


def _read_chunk(fd: int, view: memoryview, offset: int, where: str,
                new: Any) -> bytes:
    h: Hasher = new()
    for lo in range(0, view.nbytes, HOT_PIECE_BYTES):
        piece = view[lo : lo + HOT_PIECE_BYTES]
        pread_exact(fd, piece, offset + lo, where)
        h.update(piece)
    return h.digest()


class _Buffers:
    """The read buffers of one load, each as large as the load's largest segment
    (``nbytes``), so that any segment fits in any of them: a buffer whose segment was
    served is taken again by the next one (already faulted in: no kernel zeroing, no page
    faults). Two segments are in flight at most, so two buffers serve the whole load; the
    pages a buffer's segments never touch are never faulted in."""

    def __init__(self, nbytes: int) -> None:
        self._nbytes = nbytes
        self._free: list[memoryview] = []

    def take(self, nbytes: int) -> memoryview:
        """A buffer of at least ``nbytes``: a free one, else a fresh one."""
        for buf in self._free:
            if buf.nbytes >= nbytes:
                self._free.remove(buf)
                return buf
        return read_buffer(max(nbytes, self._nbytes))

    def give(self, buf: memoryview) -> None:
        """Return a buffer nothing reads or writes any more (its segment was served)."""
        self._free.append(buf)


class _VerifiedFile:
    """One data file being read: its record, its descriptor, and the segments in flight."""

    def __init__(self, path: str, record: FileRecord, pool: ThreadPoolExecutor,
                 buffers: _Buffers) -> None:
        n_chunks = -(-record.size_bytes // CHUNK_SIZE_BYTES)
        if (len(record.chunk_digests) != n_chunks or combine(
                [bytes.fromhex(d) for d in record.chunk_digests], record.scheme) != record.digest):
            raise CheckpointCorruptError(
                f"{path}: the manifest's chunk digests do not add up to its digest for this "
                "file (the manifest is corrupt)")
        self.path, self.record, self._pool, self.buffers = path, record, pool, buffers
        self._new = factory(record.scheme)
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        size = os.fstat(self.fd).st_size
        if size != record.size_bytes:
            os.close(self.fd)
            raise CheckpointCorruptError(f"{path}: size is {size} bytes, the manifest says "
                                         f"{record.size_bytes} (truncated or overwritten after the save)")

    def submit(self, seg: Segment) -> tuple[memoryview, memoryview, list[Future[bytes]]]:
        """Start reading and hashing ``seg``: (the whole buffer, to give back once served;
        the segment's bytes in it; a future per chunk)."""
        lo = seg.first * CHUNK_SIZE_BYTES
        hi = min(seg.end * CHUNK_SIZE_BYTES, self.record.size_bytes)
        # uninitialised, reused or in huge pages (readbuf): the pool's reads fault a fresh
        # one in 2 MiB at a time, in parallel, instead of 4 KiB pages one fault at a time
        whole = self.buffers.take(hi - lo)
        buf = whole[: hi - lo]
        futures = [self._pool.submit(_read_chunk, self.fd, buf[a - lo : min(a + CHUNK_SIZE_BYTES, hi) - lo],
                                     a, self.path, self._new)
                   for a in range(lo, hi, CHUNK_SIZE_BYTES)]
        return whole, buf, futures

    def check(self, seg: Segment, futures: list[Future[bytes]]) -> str | None:
        """Wait for a segment's chunks; what is wrong with the first that differs from the
        manifest (None: all match)."""
        try:
            got = [f.result().hex() for f in futures]
        except (OSError, EOFError) as exc:
            return f"unreadable ({exc})"
        record = self.record
        for k, (want, digest) in enumerate(zip(record.chunk_digests[seg.first : seg.end], got,
                                               strict=True)):
            if want != digest:
                i = seg.first + k
                lo, hi = i * CHUNK_SIZE_BYTES, min((i + 1) * CHUNK_SIZE_BYTES, record.size_bytes)
                return (f"{short_name(record.scheme)} mismatch in bytes [{lo}, {hi}) (chunk "
                        f"{i + 1} of {len(record.chunk_digests)}): expected {want[:16]}..., got "
                        f"{digest[:16]}... (contents changed after the save; found while "
                        "loading, nothing of that chunk was used)")
        return None

    def close(self) -> None:
        os.close(self.fd)


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over verified bytes (``torch.load`` reads from it)."""

    def __init__(self, view: memoryview) -> None:
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self._view.nbytes - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _load_tensor(view: memoryview) -> torch.Tensor:
    """The tensor DCP saved as ``view`` (a ``torch.save`` archive), unpickled with torch's
    ``weights_only`` unpickler, its storage a view of ``view`` itself (no copy: what
    ``torch.load(mmap=True)`` does with a file), so the verified bytes go straight into the
    state by the caller's ``copy_``. Falls back to a plain ``torch.load`` (one more copy)
    where torch's loader does not take a storage."""
    storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage() if view.nbytes else None
    serialization: Any = torch.serialization
    try:
        with serialization._open_zipfile_reader(io.BufferedReader(_ViewFile(view))) as archive:
            return cast(torch.Tensor, serialization._load(
                archive, "cpu", serialization._weights_only_unpickler, overall_storage=storage))
    except (AttributeError, TypeError):  # another torch's private loader
        return cast(torch.Tensor, torch.load(io.BufferedReader(_ViewFile(view)),
                                             map_location="cpu", weights_only=True))


class VerifyingReader(SafeReader):
    """:class:`~rayguard.checkpoint.dcp_safe.SafeReader` whose data reads are verified chunk
    by chunk against ``manifest`` before use (see the module docstring). A refusal is kept
    in :attr:`refusal` (and, for a file that fails its digest or size, :attr:`problem`) and
    raised (DCP then fails the load on every rank)."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], manifest: Manifest, *,
                 threads: int | None = None) -> None:
        super().__init__(checkpoint_dir, manifest)
        self._records = {f.path.removeprefix(f"{DCP_DIR}/"): f for f in manifest.files
                         if f.path.startswith(f"{DCP_DIR}/")}
        self._threads = threads or default_threads()
        self.bytes_verified = 0
        self.items_used = 0
        """Items copied into the state (a refused load with none left the state untouched)."""
        self.problem: Problem | None = None
        """The file (path relative to the checkpoint) and what is wrong with it."""

    def read_data(self, plan: Any, planner: Any) -> TorchFuture[None]:
        try:
            self._read_all(plan, planner)
        except CheckpointCorruptError as exc:
            self.refusal = exc
            raise
        fut: TorchFuture[None] = TorchFuture()
        fut.set_result(None)
        return fut

    def _read_all(self, plan: Any, planner: Any) -> None:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        plans = {rel: plan_segments([(self.storage_data[r.storage_index].offset,
                                      self.storage_data[r.storage_index].length) for r in reqs])
                 for rel, reqs in per_file.items()}
        largest = max(((s.end - s.first) * CHUNK_SIZE_BYTES for segs in plans.values()
                       for s in segs), default=0)
        buffers = _Buffers(largest)
        with runtime.pool(self._threads, "rg-dcp-verify") as pool:
            for rel, reqs in per_file.items():
                self._read_file(rel, reqs, plans[rel], planner, pool, buffers)

    def _refuse(self, rel_path: str, what: str) -> CheckpointCorruptError:
        self.problem = Problem(rel_path, what)
        return CheckpointCorruptError(f"{os.path.join(self._checkpoint_dir, rel_path)}: {what}")

    def _read_file(self, rel: str, reqs: list[Any], segments: list[Segment], planner: Any,
                   pool: ThreadPoolExecutor, buffers: _Buffers) -> None:
        record = self._records.get(rel)
        if record is None:
            raise self._refuse(f"{DCP_DIR}/{rel}", "not in the manifest; refusing to read it")
        path = str(resolve_inside(Path(self._checkpoint_dir), record.path))
        infos = [self.storage_data[r.storage_index] for r in reqs]
        try:
            file = _VerifiedFile(path, record, pool, buffers)
        except OSError as exc:
            raise self._refuse(record.path, f"unreadable ({exc})") from None
        except CheckpointCorruptError as exc:
            raise self._refuse(record.path, str(exc).removeprefix(f"{path}: ")) from None
        window: deque[tuple[Segment, memoryview, memoryview, list[Future[bytes]]]] = deque()
        try:
            for k, seg in enumerate(segments):
                window.append((seg, *file.submit(seg)))
                if k == 0 and len(segments) > 1:
                    continue  # keep one segment reading ahead
                self._serve(file, window.popleft(), reqs, infos, planner)
            while window:
                self._serve(file, window.popleft(), reqs, infos, planner)
        finally:
            for *_, futures in window:
                for f in futures:
                    f.cancel()
            for *_, futures in window:
                for f in futures:
                    if not f.cancelled():
                        f.exception()  # no thread still writes into a buffer or reads the fd
            file.close()

    def _serve(self, file: _VerifiedFile,
               entry: tuple[Segment, memoryview, memoryview, list[Future[bytes]]],
               reqs: list[Any], infos: list[Any], planner: Any) -> None:
        seg, whole, buf, futures = entry
        what = file.check(seg, futures)
        if what is not None:  # before any of these bytes is used
            raise self._refuse(file.record.path, what)
        self.bytes_verified += buf.nbytes
        base = seg.first * CHUNK_SIZE_BYTES
        for i in seg.items:
            info, req = infos[i], reqs[i]
            view = buf[info.offset - base : info.offset - base + info.length]
            self.items_used += 1
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(view)))
                continue
            tensor = _load_tensor(view)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise self._refuse(file.record.path, f"item {req.storage_index} holds a tensor of "
                                   f"size {tuple(tensor.size())}, the plan expects {tuple(target.size())}")
            target.copy_(tensor)
            planner.commit_tensor(req, target)
        # every item was copied out (copy_ into the state's own tensors; bytes() for the
        # rest): a later segment may reuse the buffer once this returns
        file.buffers.give(whole)
