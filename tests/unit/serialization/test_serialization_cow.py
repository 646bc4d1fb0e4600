"""Copy-on-write views: parsing /proc maps, and a private mapping of a shared file."""

from __future__ import annotations

import mmap
import os
import tempfile

import pytest
import torch

from rayguard.serialization import cow

MAPS = """\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python
7f1514000000-7f1524000000 rw-s 00000000 00:1b 2                          /dev/shm/plasmaNkD7ZM (deleted)
7f1524000000-7f1524100000 rw-p 00000000 00:00 0
7f1600000000-7f1600200000 rw-s 00001000 00:1b 9                          /dev/shm/other file
"""


def test_parse_only_shared_file_mappings() -> None:
    lines = MAPS.splitlines()
    assert cow.parse_maps_line(lines[0]) is None  # private
    assert cow.parse_maps_line(lines[2]) is None  # anonymous
    r = cow.parse_maps_line(lines[1])
    assert r == cow.Region(0x7F1514000000, 0x7F1524000000, 0, 2, "/dev/shm/plasmaNkD7ZM (deleted)")
    assert cow.parse_maps_line(lines[3]).path == "/dev/shm/other file"


def test_find_region() -> None:
    assert cow.find_region(0x7F1514000040, MAPS).inode == 2
    assert cow.find_region(0x7F1600000000, MAPS).file_offset == 0x1000
    assert cow.find_region(0x7F1524000010, MAPS) is None
    assert cow.find_region(0x10, MAPS) is None


def test_anonymous_memory_has_no_private_view() -> None:
    assert cow.private_view(memoryview(bytes(1 << 20))) is None


def _shared_file_view(nbytes: int) -> tuple[mmap.mmap, memoryview]:
    d = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.NamedTemporaryFile(dir=d) as f:
        f.write(bytes(range(256)) * (nbytes // 256))
        f.flush()
        m = mmap.mmap(f.fileno(), nbytes, flags=mmap.MAP_SHARED)
    return m, memoryview(m)[100:].toreadonly()  # file unlinked, like plasma's; odd offset


def test_private_view_shares_pages_and_keeps_writes_private() -> None:
    m, shared = _shared_file_view(1 << 20)
    region = cow.find_region(cow.buffer_address(shared), open("/proc/self/maps").read())
    if region is None or cow.arena_fd(region) is None:
        pytest.skip("this process may not reopen its own mappings (no CAP_SYS_ADMIN)")
    view = cow.private_view(shared)
    assert view is not None and not view.readonly and view.nbytes == shared.nbytes
    t = torch.frombuffer(view, dtype=torch.uint8)
    assert cow.is_private_mapping(t.data_ptr())
    assert bytes(view[:4]) == bytes(shared[:4]) == bytes([100, 101, 102, 103])
    t.fill_(7)
    assert shared[0] == 100 and m[100] == 100  # the file (the "object store") is untouched
    m[101] = 42
    assert t[0].item() == 7
