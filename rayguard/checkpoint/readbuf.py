"""Large read buffers that cost little to fault in: anonymous memory asking for huge pages.

A fresh buffer is mapped lazily by the kernel, which zeroes and maps it page by page the
first time it is written (the first ``pread`` into it). For a checkpoint's hundreds of MiB
that first touch, not the read or the hash, was the largest cost of a verified load on
the machines measured: 256 MiB in 4 KiB pages cost about 100 ms of system time (65,536
faults) against 15 ms for the same ``pread`` into memory already mapped. Where transparent
huge pages are on in ``madvise`` (or ``always``) mode, a buffer advised ``MADV_HUGEPAGE`` is
mapped 2 MiB at a time (128 faults for 256 MiB, about 20 ms with the read). Elsewhere the
advice is refused or ignored and the buffer is what ``torch.empty`` would give.

Pure standard library (mmap, ctypes); no torch.
"""

from __future__ import annotations

import ctypes
import mmap

HUGE_PAGE_BYTES = 2 * 1024 * 1024
"""The huge page size the buffer is aligned to (x86-64 and arm64 with 4 KiB base pages)."""

MIN_HUGE_BYTES = 4 * 1024 * 1024
"""Smaller buffers are plain ``bytearray`` memory (malloc recycles it; zeroing it is cheap)."""


def read_buffer(nbytes: int) -> memoryview:
    """A writable byte buffer of ``nbytes`` for ``pread`` to fill, not written here (the
    kernel maps zeroed pages on the first touch, in the reading threads): anonymous
    memory advised ``MADV_HUGEPAGE`` and aligned to a huge page when it is large and the
    platform offers the advice, else plain memory. The mapping is released when the
    last view of it (a slice, a tensor over it) goes away."""
    if nbytes < MIN_HUGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return memoryview(bytearray(nbytes))
    # private: a shared anonymous mapping is shmem, which takes no madvise'd huge pages
    area = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    anchor = ctypes.c_char.from_buffer(area)
    start = -ctypes.addressof(anchor) % HUGE_PAGE_BYTES
    del anchor  # the export ends here; the views below keep ``area`` mapped
    try:
        area.madvise(mmap.MADV_HUGEPAGE, start, nbytes)
    except (OSError, ValueError):  # no transparent huge pages here: plain pages
        pass
    return memoryview(area)[start : start + nbytes]
