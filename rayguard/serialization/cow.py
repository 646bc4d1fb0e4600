"""Copy-on-write views of object-store memory, made by the kernel.

Ray's object store (plasma) is one shared-memory file mapped ``MAP_SHARED`` into every
worker; ``ray.get`` hands out read-only buffers over it. A torch tensor has no read-only
flag, so exposing those pages directly lets one reader's write reach every other reader.
Instead we map the *same file pages* again with ``MAP_PRIVATE``: reading costs no copy,
and the first write to a page gives this mapping a private copy of that page only. The
object stays pinned in the store for as long as the tensor lives (we keep Ray's buffer).

To map the file we need a descriptor for it. The store file is unlinked, so we reopen it
through ``/proc/self/map_files`` (needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE) or through
the raylet that owns it (``/proc/<raylet>/fd/N``, same user). When neither works the caller
falls back to an eager copy: slower, equally safe.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

_lock = threading.Lock()
# Per process: a cache of this process's file descriptors, (path, inode) -> fd (None: cannot open).
_arena_fds: dict[tuple[str, int], int | None] = {}


@dataclass(frozen=True)
class Region:
    """One line of /proc/self/maps: a shared file mapping."""

    start: int
    end: int
    file_offset: int
    inode: int
    path: str


class _PrivateMap(mmap.mmap):
    """A private mapping that also holds Ray's buffer, so the store object stays pinned."""

    keepalive: object


def parse_maps_line(line: str) -> Region | None:
    """Pure: a shared, file-backed mapping line of /proc/<pid>/maps, else ``None``."""
    parts = line.split(maxsplit=5)
    if len(parts) < 6 or parts[1][3:4] != "s" or parts[4] == "0":
        return None
    start, end = (int(x, 16) for x in parts[0].split("-"))
    return Region(start, end, int(parts[2], 16), int(parts[4]), parts[5].strip())


def find_region(addr: int, maps_text: str) -> Region | None:
    """Pure: the shared file mapping that contains ``addr``."""
    for line in maps_text.splitlines():
        head = line.split("-", 1)[0]
        if not head or int(head, 16) > addr:
            continue
        region = parse_maps_line(line)
        if region is not None and region.start <= addr < region.end:
            return region
    return None


def _open_via_map_files(region: Region) -> int | None:
    try:
        return os.open(f"/proc/self/map_files/{region.start:x}-{region.end:x}", os.O_RDONLY)
    except OSError:
        return None


def _open_via_raylet(region: Region) -> int | None:
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "raylet":
                    continue
            fd_dir = f"/proc/{pid}/fd"
            for name in os.listdir(fd_dir):
                link = os.path.join(fd_dir, name)
                try:
                    if os.readlink(link) == region.path and os.stat(link).st_ino == region.inode:
                        return os.open(link, os.O_RDONLY)
                except OSError:
                    continue
        except OSError:
            continue
    return None


def arena_fd(region: Region) -> int | None:
    """A read-only descriptor of the file behind ``region`` (cached), or ``None``."""
    key = (region.path, region.inode)
    with _lock:
        if key in _arena_fds:
            return _arena_fds[key]
        fd = _open_via_map_files(region)
        if fd is None:
            fd = _open_via_raylet(region)
        if fd is not None and os.fstat(fd).st_ino != region.inode:
            os.close(fd)
            fd = None
        if fd is None:
            logger.info("rayguard: cannot reopen %s; received tensors are copied", region.path)
        _arena_fds[key] = fd
        return fd


def buffer_address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


def private_view(buf: memoryview) -> memoryview | None:
    """A writable copy-on-write view of the read-only ``buf``, or ``None`` if impossible.

    Writes to the result never reach ``buf``'s memory (nor any other reader of it).
    """
    nbytes = buf.nbytes
    if nbytes == 0:
        return None
    addr = buffer_address(buf)
    try:
        with open("/proc/self/maps") as f:
            region = find_region(addr, f.read())
    except OSError:
        return None
    if region is None or addr + nbytes > region.end:
        return None
    fd = arena_fd(region)
    if fd is None:
        return None
    file_pos = region.file_offset + (addr - region.start)
    delta = file_pos % mmap.ALLOCATIONGRANULARITY
    try:
        m = _PrivateMap(fd, delta + nbytes, flags=mmap.MAP_PRIVATE,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=file_pos - delta)
    except (OSError, ValueError):
        return None
    m.keepalive = buf
    return memoryview(m)[delta:delta + nbytes]


def is_private_mapping(addr: int) -> bool:
    """Whether ``addr`` lies in a private file mapping (a copy-on-write view); for tests."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= addr < end:
                return parts[1][3] == "p" and len(parts) == 6 and parts[4] != "0"
    return False
