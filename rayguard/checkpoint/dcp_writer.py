"""DCP's file writer, hashing every byte of its data files as it writes them.

``dcp.save`` writes each rank's ``__<rank>_<n>.distcp`` through a stream from its
``FileSystem.create_stream``; :class:`HashingWriter` hands it a stream that feeds each write
to a :class:`~rayguard.checkpoint.hashing.WriteHasher` (the hash runs on a thread pool while
the same bytes go to the file), so the manifest's records come from the bytes that were
written, with no second read pass. The digests are in the writer's ``scheme``
(:mod:`rayguard.checkpoint.schemes`), the same as the checkpoint's other files.

Imports torch: import it lazily.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint import filesystem as dcp_fs
from torch.futures import Future

from rayguard import runtime
from rayguard.checkpoint.hashing import WriteHasher, default_threads
from rayguard.checkpoint.schemes import current

Digest = tuple[int, str, tuple[str, ...]]
"""(size in bytes, file digest, chunk digests) of one written file, in the writer's scheme."""


class _HashingStream:
    """The file DCP writes to, hashing each write (``write``/``tell``/``flush``/``fileno``/
    ``close``: what DCP and ``torch.save`` use)."""

    def __init__(self, raw: Any, hasher: WriteHasher) -> None:
        self._raw = raw
        self._hasher = hasher

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        return self._hasher.around(view, lambda: self._raw.write(view))

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # a seek would break the stream's hash

    def tell(self) -> int:
        return int(self._raw.tell())

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)


class _HashingFileSystem(dcp_fs.FileSystem):
    def __init__(self, owner: HashingWriter) -> None:
        super().__init__()
        self._owner = owner

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        with super().create_stream(path, mode) as raw:
            if mode != "wb" or not os.path.basename(path).endswith(dcp_fs.DEFAULT_SUFFIX):
                yield raw
                return
            hasher = WriteHasher(self._owner.pool, scheme=self._owner.scheme)
            yield _HashingStream(raw, hasher)
            self._owner.record(os.path.basename(path), hasher)


class HashingWriter(FileSystemWriter):
    """``FileSystemWriter`` whose data files are hashed while written: :attr:`digests` maps
    each data file's name to its :data:`Digest` once ``dcp.save`` returned, in :attr:`scheme`
    (the process's selection unless ``scheme=`` names one)."""

    def __init__(self, path: str | os.PathLike[str], *, threads: int | None = None,
                 scheme: str | None = None, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.scheme = scheme or current()
        self.fs = _HashingFileSystem(self)
        self._threads = threads or default_threads()
        self._lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None
        self.digests: dict[str, Digest] = {}

    def write_data(self, plan: Any, planner: Any) -> Future[list[Any]]:
        with runtime.pool(self._threads, "rg-dcp-hash") as pool:
            self.pool = pool
            try:
                return super().write_data(plan, planner)
            finally:
                self.pool = None

    def record(self, name: str, hasher: WriteHasher) -> None:
        digest, chunks = hasher.finish()
        with self._lock:
            self.digests[name] = (hasher.nbytes, digest, chunks)
