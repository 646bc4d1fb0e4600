"""The hang stack dump never writes through a link another local user planted, nor into a
folder someone else can read or replace: with remote storage, or when ``rayguard_stacks``
is a link, another user's, or group/world-writable, it goes into a fresh 0700 mkdtemp
directory; the file is created 0600 without following links (O_NOFOLLOW, O_EXCL). Real
files, real links."""

from __future__ import annotations

import os
import stat
import tempfile
import time

import pytest

from rayguard.health.stall import dump_stacks
from rayguard.train.context import GuardContext

VICTIM_TEXT = "precious\n"


def _ctx(run_dir: str) -> GuardContext:
    return GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                        node_id="node0", device="cpu", seed=None, attempt=0, run_dir=run_dir)


def _plant_links(folder, victim) -> None:
    """Links under every name the dump could take in the next minute (old and new names)."""
    folder.mkdir(exist_ok=True)
    now = int(time.time())
    for t in range(now - 5, now + 60):
        for name in (f"rank0-attempt0-{t}.txt", f"rank0-attempt0-{t}-{os.getpid()}.txt"):
            os.symlink(victim, folder / name)


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    """mkdtemp folders land under the test's own directory."""
    (tmp_path / "private-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "private-tmp"))


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def test_remote_storage_dump_ignores_a_planted_tmpdir_folder(tmp_path, victim, monkeypatch):
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    _plant_links(shared_tmp / "rayguard_stacks", victim)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    path = dump_stacks(_ctx("s3://bucket/run"), local_run_dir=False)
    assert victim.read_text() == VICTIM_TEXT
    assert path is not None and "Python stacks" in open(path).read()
    folder = os.path.dirname(path)
    assert os.path.dirname(folder) == str(shared_tmp)
    assert folder != str(shared_tmp / "rayguard_stacks")
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


def test_run_dir_dump_does_not_follow_planted_file_links(tmp_path, victim):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _plant_links(run_dir / "rayguard_stacks", victim)
    dump_stacks(_ctx(str(run_dir)), local_run_dir=True)
    assert victim.read_text() == VICTIM_TEXT


def _private_elsewhere(path, run_dir) -> None:
    """The dump went to a fresh private folder, not into the run directory's."""
    assert path is not None and "Python stacks" in open(path).read()
    folder = os.path.dirname(path)
    assert folder != str(run_dir / "rayguard_stacks")
    assert os.path.basename(folder).startswith("rayguard_stacks-")
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_run_dir_dump_does_not_follow_a_planted_folder_link(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, run_dir / "rayguard_stacks")
    _private_elsewhere(dump_stacks(_ctx(str(run_dir)), local_run_dir=True), run_dir)
    assert os.listdir(elsewhere) == []


def test_a_world_writable_stacks_folder_is_not_used(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "rayguard_stacks").mkdir(parents=True)
    os.chmod(run_dir / "rayguard_stacks", 0o777)
    _private_elsewhere(dump_stacks(_ctx(str(run_dir)), local_run_dir=True), run_dir)
    assert os.listdir(run_dir / "rayguard_stacks") == []


def test_another_users_stacks_folder_is_not_used(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "rayguard_stacks").mkdir(parents=True)
    os.chmod(run_dir / "rayguard_stacks", 0o755)
    try:
        os.chown(run_dir / "rayguard_stacks", 65534, 65534)
    except PermissionError:
        pytest.skip("needs root to give the folder to another user")
    _private_elsewhere(dump_stacks(_ctx(str(run_dir)), local_run_dir=True), run_dir)
    assert os.listdir(run_dir / "rayguard_stacks") == []


def test_the_folder_rayguard_creates_is_private(tmp_path):
    path = dump_stacks(_ctx(str(tmp_path / "run")), local_run_dir=True)
    assert path is not None and os.path.dirname(path) == str(tmp_path / "run" / "rayguard_stacks")
    assert stat.S_IMODE(os.lstat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_run_dir_dump_writes_the_stacks(tmp_path):
    path = dump_stacks(_ctx(str(tmp_path)), local_run_dir=True)
    assert path is not None and path.startswith(str(tmp_path / "rayguard_stacks"))
    assert "Python stacks" in open(path).read()
