"""Disk full / I/O errors during a save fail cleanly: a clear error, no staging left,
earlier checkpoints intact and still the one that loads."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import find_latest_valid, load, save
from rayguard.checkpoint.commit import staging_dir_for
from rayguard.checkpoint.fsio import inject_write_error
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointError


def _assert_clean_failure(root: Path, failed: Path, exc: CheckpointError, err_fragment: str) -> None:
    message = str(exc)
    assert err_fragment in message and "Fix:" in message
    assert "shard-rank00000" in message or "manifest" in message  # names the file
    assert not failed.exists() and not staging_dir_for(failed).exists()
    found = find_latest_valid(root)
    assert found is not None and found[0] == root / "checkpoint_000001"
    assert load(found[0])["step"] == 1


@pytest.mark.parametrize("path_contains, after_bytes", [("shard-rank", 1 << 20), ("shard-rank", 0), ("manifest", 0)])
def test_injected_enospc_during_a_save(tmp_path: Path, path_contains: str, after_bytes: int) -> None:
    save(tmp_path / "checkpoint_000001", {"w": torch.ones(10), "step": 1}, step=1)
    failed = tmp_path / "checkpoint_000002"
    with inject_write_error(errno.ENOSPC, after_bytes=after_bytes, path_contains=path_contains):
        with pytest.raises(CheckpointError) as info:
            save(failed, {"w": torch.ones(1 << 20), "step": 2}, step=2)
    _assert_clean_failure(tmp_path, failed, info.value, "[Errno 28] No space left on device")
    assert "num_to_keep" in str(info.value)


def test_injected_eio_names_the_error(tmp_path: Path) -> None:
    save(tmp_path / "checkpoint_000001", {"step": 1}, step=1)
    failed = tmp_path / "checkpoint_000002"
    with inject_write_error(errno.EIO), pytest.raises(CheckpointError) as info:
        save(failed, {"w": torch.ones(100), "step": 2}, step=2)
    _assert_clean_failure(tmp_path, failed, info.value, "[Errno 5]")


def test_write_shard_removes_its_partial_file(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    with inject_write_error(after_bytes=1000), pytest.raises(CheckpointError, match="could not write"):
        write_shard(staging, 3, {"w": torch.ones(10_000)})
    assert list(staging.iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (needs root and mount; skipped otherwise)."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_enospc_on_a_full_filesystem(small_tmpfs: Path) -> None:
    save(small_tmpfs / "checkpoint_000001", {"w": torch.ones(1000), "step": 1}, step=1)
    failed = small_tmpfs / "checkpoint_000002"
    with pytest.raises(CheckpointError) as info:
        save(failed, {"w": torch.ones(1 << 20), "step": 2}, step=2)  # 4 MiB > 2 MiB
    _assert_clean_failure(small_tmpfs, failed, info.value, "[Errno 28] No space left on device")
    # The space is given back: the next small save succeeds.
    save(small_tmpfs / "checkpoint_000003", {"step": 3}, step=3)
    assert load(small_tmpfs / "checkpoint_000003")["step"] == 3
