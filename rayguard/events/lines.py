"""Whole lines of a log file, local or on a pyarrow filesystem, in bounded memory.

Where a log lives is an :class:`EventSource`; :class:`LineReader` streams it (and, called
again, what was appended since: a live run), never holding more than one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from rayguard.checkpoint.fsio import open_regular
from rayguard.safejson import MAX_LINE_BYTES

CHUNK_BYTES = 1 << 18
"""How much of a log is read at a time (256 KiB)."""


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
    from ``start`` on (up to ``end``: one part of a file read in parts, from the offsets
    :func:`split_points` found); a line longer than ``max_line_bytes`` is dropped as it streams by
    (``None`` stands for it) instead of being buffered, and a last line without its newline
    waits in :attr:`pending` (at most ``max_line_bytes``) for the next :meth:`read`."""

    def __init__(self, source: EventSource, *, chunk_bytes: int = CHUNK_BYTES,
                 max_line_bytes: int = MAX_LINE_BYTES, start: int = 0,
                 end: int | None = None) -> None:
        self.source, self.chunk_bytes, self.max_line_bytes = source, chunk_bytes, max_line_bytes
        self.offset = start
        self.end = end  # read up to this offset (a part of the file), None: to its end
        self.pending = b""
        self._skipping = False  # inside a line already found too long

    def read(self) -> Iterator[bytes | None]:
        """The whole lines appended since the last call (``None``: a line too long)."""
        for lines in self.read_batches():
            yield from lines

    def read_batches(self) -> Iterator[list[bytes | None]]:
        """As :meth:`read`, the lines of each chunk read as one list (a reader of a long log
        loops over lists, not one generator step per line)."""
        with _open(self.source, self.offset) as f:
            while True:
                size = self.chunk_bytes if self.end is None else min(self.chunk_bytes,
                                                                       self.end - self.offset)
                chunk = f.read(size) if size > 0 else b""
                if not chunk:
                    return
                self.offset += len(chunk)
                yield self._split(chunk)

    def _split(self, chunk: bytes) -> list[bytes | None]:
        # one split in C per chunk; Python touches only the first and last piece
        pieces: list[bytes | None] = chunk.split(b"\n")  # type: ignore[assignment]
        tail: bytes = pieces.pop()  # type: ignore[assignment]  # after the last newline
        if pieces:
            head, self.pending = self.pending + pieces[0], b""  # type: ignore[operator]
            if self._skipping:  # the end of a line already found too long
                self._skipping = False
                del pieces[0]
                whole = 0  # the pieces from here on are whole lines
            else:
                pieces[0] = head if len(head) <= self.max_line_bytes else None
                whole = 1
            if max(map(len, islice(pieces, whole, None)), default=0) > self.max_line_bytes:  # type: ignore[arg-type]
                pieces = [line if line is None or len(line) <= self.max_line_bytes else None
                          for line in pieces]
        if not self._skipping:
            self.pending += tail
            if len(self.pending) > self.max_line_bytes:
                self.pending, self._skipping = b"", True
                pieces.append(None)
        return pieces

    def finish(self) -> bytes | None:
        """The last line when the file ended without a newline (a line cut by a crash)."""
        line, self.pending = self.pending, b""
        return line if line.strip() else None


def split_points(source: EventSource, parts: int) -> list[tuple[int, int | None]]:
    """``(start, end)`` of ``parts`` parts of a local log, each starting a line (``end``
    ``None``: to the end of the file, however long it is by then). One part, the whole
    file, when the log is remote or no line ends near a cut (a line longer than the bound
    being written there)."""
    whole: list[tuple[int, int | None]] = [(0, None)]
    if parts < 2 or source.filesystem is not None:
        return whole
    fd = open_regular(source.path)
    try:
        size = os.fstat(fd).st_size
        if size < parts:
            return whole
        cuts = []
        for i in range(1, parts):
            at = size * i // parts
            window = os.pread(fd, MAX_LINE_BYTES + 1, at - 1)  # from the byte before the cut
            newline = window.find(b"\n")
            if newline < 0:
                return whole
            cuts.append(at + newline)
    finally:
        os.close(fd)
    cuts = sorted(set(cuts))
    return list(zip([0, *cuts], [*cuts, None], strict=True))
