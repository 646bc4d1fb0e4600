"""Whole lines of a log file, local or on a pyarrow filesystem, in bounded memory.

Where a log lives is an :class:`EventSource`; :class:`LineReader` streams it (and, called
again, what was appended since: a live run), never holding more than one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rayguard.checkpoint.fsio import open_regular
from rayguard.safejson import MAX_LINE_BYTES

CHUNK_BYTES = 1 << 16
"""How much of a log is read at a time."""


@dataclass
class EventSource:
    """Where a log lives: ``kind`` is ``"run"`` or ``"sweep"``; ``path`` is the JSONL file
    on ``filesystem`` (``None``: the local filesystem)."""

    kind: str
    path: str
    filesystem: Any = None


def _open(source: EventSource, offset: int) -> Any:
    if source.filesystem is None:
        # a regular file, not through a link, never blocking on a FIFO planted there
        # (NotRegularFileError, an OSError, otherwise)
        f = os.fdopen(open_regular(source.path), "rb")
        f.seek(offset)
        return f
    if offset == 0:
        return source.filesystem.open_input_stream(source.path)
    f = source.filesystem.open_input_file(source.path)
    f.seek(offset)
    return f


class LineReader:
    """Whole lines from a growing file, in bounded memory: reads ``chunk_bytes`` at a time
    from ``offset`` on; a line longer than ``max_line_bytes`` is dropped as it streams by
    (``None`` stands for it) instead of being buffered, and a last line without its newline
    waits in :attr:`pending` (at most ``max_line_bytes``) for the next :meth:`read`."""

    def __init__(self, source: EventSource, *, chunk_bytes: int = CHUNK_BYTES,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.source, self.chunk_bytes, self.max_line_bytes = source, chunk_bytes, max_line_bytes
        self.offset = 0
        self.pending = b""
        self._skipping = False  # inside a line already found too long

    def read(self) -> Iterator[bytes | None]:
        """The whole lines appended since the last call (``None``: a line too long)."""
        with _open(self.source, self.offset) as f:
            while True:
                chunk = f.read(self.chunk_bytes)
                if not chunk:
                    return
                self.offset += len(chunk)
                yield from self._split(chunk)

    def _split(self, chunk: bytes) -> Iterator[bytes | None]:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            piece, start = chunk[start:end], end + 1
            if self._skipping:
                self._skipping = False
                continue
            line, self.pending = self.pending + piece, b""
            yield line if len(line) <= self.max_line_bytes else None
        if not self._skipping:
            self.pending += chunk[start:]
            if len(self.pending) > self.max_line_bytes:
                self.pending, self._skipping = b"", True
                yield None

    def finish(self) -> bytes | None:
        """The last line when the file ended without a newline (a line cut by a crash)."""
        line, self.pending = self.pending, b""
        return line if line.strip() else None
