"""Digests of files on disk (:func:`~rayguard.checkpoint.file_digests.hash_files`): the same
whichever thread reads a file and however it is read (whole or in chunks), a file that is
not the size it is hashed at is an error, and small files move to the pool once they are
seen to wait for the storage."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from rayguard.checkpoint import file_digests, schemes
from rayguard.checkpoint.file_digests import Pacer, SizeChangedError, hash_files
from rayguard.checkpoint.hashing import digest_bytes
from rayguard.checkpoint.verify import plain_file

CHUNK = 1000


def _files(tmp_path: Path) -> list[tuple[Path, bytes]]:
    """Many small files (some empty, some of exactly one chunk) and a few of many chunks."""
    rng = random.Random(3)
    sizes = [rng.choice([0, 1, 7, 999, 1000]) for _ in range(300)] + [1001, 2000, 5500]
    rng.shuffle(sizes)
    out = []
    for i, size in enumerate(sizes):
        path, data = tmp_path / f"f{i}", rng.randbytes(size)
        path.write_bytes(data)
        out.append((path, data))
    return out


@pytest.mark.parametrize("scheme", [schemes.SHA256, schemes.BLAKE3])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("here", [True, False])
@pytest.mark.parametrize("known_sizes", [True, False])
def test_every_way_of_reading_gives_the_reference_digests(tmp_path, monkeypatch, scheme, threads,
                                                          here, known_sizes):
    monkeypatch.setattr(file_digests, "INLINE_BYTES", 4000)  # a pool, tasks of a few files
    monkeypatch.setattr(file_digests, "SMALL_FILE_BYTES", 999)  # a chunk of 1000: chunked
    if not here:
        monkeypatch.setattr(Pacer, "__init__", lambda self: setattr(self, "here", False))
    files = _files(tmp_path)
    sizes = [len(data) for _, data in files] if known_sizes else None
    got = hash_files([p for p, _ in files], threads=threads, chunk_size=CHUNK, scheme=scheme,
                     sizes=sizes)
    assert got == [digest_bytes(data, CHUNK, scheme=scheme) for _, data in files]


@pytest.mark.parametrize("size", [10, 3500])  # one small read; chunks
def test_a_file_not_of_its_size_is_an_error(tmp_path, size):
    path = tmp_path / "f"
    path.write_bytes(b"x" * size)
    grew, shrank, same = hash_files([path, path, path], chunk_size=CHUNK,
                                    sizes=[size - 1, size + 1, size])
    assert isinstance(grew, SizeChangedError) and "written to while read" in str(grew)
    assert isinstance(shrank, EOFError) and "truncated" in str(shrank)
    assert same == digest_bytes(b"x" * size, CHUNK)


def test_a_link_or_a_missing_file_is_an_error_not_followed(tmp_path):
    (tmp_path / "real").write_bytes(b"data")
    os.symlink(tmp_path / "real", tmp_path / "link")
    link, missing = hash_files([tmp_path / "link", tmp_path / "missing"], sizes=[4, 4])
    assert isinstance(link, OSError) and isinstance(missing, FileNotFoundError)


class _Clocks:
    """Stands in for the ``time`` module the pacer reads: each batch takes ``wall`` s of wall
    time and ``cpu`` s of this thread's CPU time (a loaded machine cannot stretch them)."""

    def __init__(self, wall: float, cpu: float) -> None:
        self.wall_step, self.cpu_step = wall, cpu
        self.wall = self.cpu = 0.0
        self.calls = 0

    def perf_counter(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:  # the second reading of a batch: the batch has run
            self.wall += self.wall_step
        return self.wall

    def thread_time(self) -> float:
        if self.calls % 2 == 0:
            self.cpu += self.cpu_step
        return self.cpu


@pytest.mark.parametrize(("wall", "cpu", "here"), [(1.0, 1.0, True), (3.9, 1.0, True),
                                                   (4.1, 1.0, False), (1.0, 0.0, False)])
def test_the_pacer_decides_from_wall_time_over_cpu_time(monkeypatch, wall, cpu, here):
    monkeypatch.setattr(file_digests, "time", _Clocks(wall, cpu))
    pacer = Pacer(probe_batches=2)
    assert pacer.run(sum, [1]) == 1 and pacer.here  # still probing
    for _ in range(3):
        pacer.run(sum, [1])
    assert pacer.here is here


def test_the_pacer_keeps_cpu_bound_batches_here_and_sends_waiting_ones_to_the_pool():
    # CPU in this thread: the decision from the real clocks when the machine is quiet (on a
    # loaded one, wall time stretches: the decision itself is proved on fixed clocks above)
    busy = Pacer(probe_batches=2, wait_ratio=50.0)
    for _ in range(3):
        busy.run(sum, range(200_000))
    assert busy.here
    waiting = Pacer(probe_batches=2)
    assert waiting.run(time.sleep, 0.02) is None and waiting.here  # still probing
    waiting.run(time.sleep, 0.02)
    assert not waiting.here


def test_plain_file_checks_each_folder_once_and_declines_a_linked_one(tmp_path):
    root = tmp_path / "ckpt"
    (root / "dcp").mkdir(parents=True)
    (root / "dcp" / "a").write_bytes(b"x")
    (root / "dcp" / "b").write_bytes(b"yy")
    os.symlink(root / "dcp", root / "linked")
    real, folders = os.path.realpath(root), {}
    assert [plain_file(real, rel, folders)[1].st_size for rel in ("dcp/a", "dcp/b")] == [1, 2]
    assert plain_file(real, "linked/a", folders) is None
    assert folders == {f"{real}/dcp": True, f"{real}/linked": False}
