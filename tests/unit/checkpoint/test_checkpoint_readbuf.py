"""The verified sharded load's read buffers: huge-page backed where the platform offers it
(a fresh buffer costs the kernel's zeroing and page faults, more than the read itself).
Their reuse within a load: test_checkpoint_verified_read.py."""

from __future__ import annotations

import ctypes
import mmap

import pytest
import torch

from rayguard.checkpoint import readbuf


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


@pytest.mark.parametrize("nbytes", [0, 10, readbuf.MIN_HUGE_BYTES - 1, readbuf.MIN_HUGE_BYTES,
                                    3 * readbuf.HUGE_PAGE_BYTES + 5])
def test_a_buffer_has_the_size_asked_and_holds_what_is_written(nbytes: int) -> None:
    buf = readbuf.read_buffer(nbytes)
    assert buf.nbytes == nbytes and not buf.readonly
    if nbytes:
        buf[0] = 7
        buf[nbytes - 1] = 9
        assert (buf[0], buf[nbytes - 1]) == (7, 9)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_a_large_buffer_starts_on_a_huge_page_and_outlives_the_mapping_name() -> None:
    buf = readbuf.read_buffer(readbuf.MIN_HUGE_BYTES + 123)
    assert _address(buf) % readbuf.HUGE_PAGE_BYTES == 0
    tensor = torch.frombuffer(buf, dtype=torch.uint8)
    del buf  # the tensor's reference keeps the mapping alive
    tensor[-1] = 5
    assert int(tensor[-1]) == 5
