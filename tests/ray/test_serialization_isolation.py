"""Zero-copy receipt never lets one reader's write reach another reader of the same object.

Large CPU tensors arrive as copy-on-write mappings of the object store's pages (zero copy
until written); small ones, and all of them with zero_copy=False, arrive as copies.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import ray
import torch

from rayguard.serialization import cow, register_tensor_serializers
from rayguard.serialization.policy import DEFAULT_COW_MIN_BYTES

BIG = 8 * 1024 * 1024  # 32 MiB of float32: above DEFAULT_COW_MIN_BYTES
assert BIG * 4 >= DEFAULT_COW_MIN_BYTES


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


@ray.remote
def checksum(t) -> str:
    return digest(t)


@ray.remote
def write_in_place(t) -> float:
    t.add_(1000)
    return float(t[0])


@ray.remote
class Writer:
    def __init__(self) -> None:
        register_tensor_serializers()

    def policy(self, zero_copy: bool) -> None:
        register_tensor_serializers(zero_copy=zero_copy)

    def write(self, t) -> float:
        t.mul_(-1)
        t[0] = 12345
        return float(t[0])

    def read(self, ref_list: list) -> float:
        return float(ray.get(ref_list[0])[0])


def _shared_store_reopenable() -> bool:
    arr = ray.get(ray.put(np.ones(BIG, dtype=np.uint8)))  # Ray's own zero-copy numpy view
    region = cow.find_region(arr.ctypes.data, open("/proc/self/maps").read())
    return region is not None and cow.arena_fd(region) is not None


@pytest.fixture(scope="module")
def writer_box():
    box: list = []  # one actor for the module: a worker process costs seconds to start
    yield box
    for actor in box:
        ray.kill(actor)


@pytest.mark.parametrize(("n", "zero_copy"), [(BIG, True), (BIG, False), (1000, True)],
                         ids=["32MiB-zero-copy", "32MiB-copy", "4KB"])
def test_a_write_by_one_reader_is_invisible_to_every_other(ray_local, writer_box, n: int,
                                                           zero_copy: bool) -> None:
    if not writer_box:
        writer_box.append(Writer.remote())
    w = writer_box[0]
    ray.get(w.policy.remote(zero_copy))
    register_tensor_serializers(zero_copy=zero_copy)
    try:
        x = torch.randn(n)
        expected = digest(x)
        ref = ray.put(x)

        a = ray.get(ref)  # the driver's first reader writes...
        a.add_(1)
        a[0] = -7.0
        b = ray.get(ref)  # ...the driver's second reader does not see it
        assert torch.equal(b, x)
        assert ray.get(checksum.remote(ref)) == expected  # nor does another worker process

        # A worker that writes to its argument; another actor writes too; then all read again.
        assert ray.get(write_in_place.remote(ref)) == float(x[0] + 1000)
        assert ray.get(w.write.remote(ref)) == 12345.0
        assert ray.get(w.read.remote([ref])) == float(x[0])
        assert ray.get(checksum.remote(ref)) == expected
        assert torch.equal(ray.get(ref), x) and torch.equal(b, x) and a[0] == -7.0
    finally:
        register_tensor_serializers()


def test_large_tensors_are_zero_copy_until_written(ray_local) -> None:
    register_tensor_serializers()
    if not _shared_store_reopenable():
        pytest.skip("object store file cannot be reopened here: receipt falls back to a copy")
    x = torch.randn(BIG).to(torch.bfloat16)
    ref = ray.put(x)
    a, b = ray.get(ref), ray.get(ref)
    # Both are private mappings of the store's pages (no copy made), distinct from each other.
    assert cow.is_private_mapping(a.data_ptr()) and cow.is_private_mapping(b.data_ptr())
    assert a.data_ptr() != b.data_ptr()
    a.fill_(3)
    assert torch.equal(b, x) and torch.equal(ray.get(ref), x)


def test_zero_copy_off_copies(ray_local) -> None:
    register_tensor_serializers(zero_copy=False)
    try:
        a = ray.get(ray.put(torch.randn(BIG)))
        assert not cow.is_private_mapping(a.data_ptr())
    finally:
        register_tensor_serializers()


def test_store_file_reopens_through_the_raylet(ray_local) -> None:
    """The path for processes without CAP_SYS_ADMIN (typical containers)."""
    arr = ray.get(ray.put(np.ones(BIG, dtype=np.uint8)))
    region = cow.find_region(arr.ctypes.data, open("/proc/self/maps").read())
    assert region is not None and "plasma" in region.path
    fd = cow._open_via_raylet(region)
    if fd is None:
        pytest.skip("no raylet of this user is visible in /proc")
    try:
        import os

        assert os.fstat(fd).st_ino == region.inode
    finally:
        os.close(fd)
