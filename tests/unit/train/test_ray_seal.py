"""Sealing ``ray.train.report`` checkpoints never waits across Ray's barrier: two ranks as
threads, each ``ray.train.report`` played in Ray's order (barrier, then the upload in the
calling thread for SYNC, in a one-thread pool for ASYNC, none for NO_UPLOAD), for every
ordered pair of modes; the writer's manifest lists every reporting rank's files."""

from __future__ import annotations

import itertools
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from rayguard._ray.report import CheckpointUploadMode
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.train.ray_seal import ReportSealer, SealPlan, plan_seal

A, S, N = (CheckpointUploadMode.ASYNC, CheckpointUploadMode.SYNC,
           CheckpointUploadMode.NO_UPLOAD)
MODES = (A, S, N, None)  # None: no checkpoint
WAIT_S = 10.0


class _Meetings:
    """The coordinator's gather, in process: a value per rank and tag."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.slots: dict[str, dict[int, Any]] = {}
        self.cond = threading.Condition()

    def put(self, tag: str, rank: int, value: Any) -> dict[int, Any]:
        with self.cond:
            slot = self.slots.setdefault(tag, {})
            slot[rank] = value
            self.cond.notify_all()
            return slot

    def gather(self, tag: str, rank: int, value: Any) -> list[Any]:
        slot = self.put(tag, rank, value)
        with self.cond:
            if not self.cond.wait_for(lambda: len(slot) == self.world_size, timeout=WAIT_S):
                raise TimeoutError(f"rank {rank} waited for {tag!r} in vain (a deadlock)")
            return [slot[r] for r in sorted(slot)]


class _Link:
    alone = False

    def __init__(self, meetings: _Meetings, rank: int) -> None:
        self.meetings = meetings
        self.ctx = SimpleNamespace(rank=rank, world_size=meetings.world_size, attempt=0)

    def gather(self, tag: str, value: Any) -> list[Any]:
        return self.meetings.gather(tag, self.ctx.rank, value)

    def contribute(self, tag: str, value: Any) -> None:
        self.meetings.put(tag, self.ctx.rank, value)

    def quiet(self) -> _Link:
        return self


def _ray_report(barrier: threading.Barrier, pool: ThreadPoolExecutor, mode: Any,
                checkpoint: str | None, upload: Any) -> Future | None:
    """Ray's report, in its order: every rank meets first, then the upload by mode (ASYNC:
    returns at once, the upload's future left to the test)."""
    barrier.wait(timeout=WAIT_S)
    if checkpoint is None or mode == N:
        return None
    if mode == S:
        upload(checkpoint, "checkpoint_1")
        return None
    return pool.submit(upload, checkpoint, "checkpoint_1")


def _run_pair(tmp_path: Any, modes: tuple[Any, ...]) -> tuple[list[Any], list[Any]]:
    meetings, barrier = _Meetings(len(modes)), threading.Barrier(len(modes))
    pools = [ThreadPoolExecutor(max_workers=1) for _ in modes]
    persisted: list[tuple[int, int, str | None, int | None]] = []
    uploads: list[tuple[int, str]] = []
    errors: list[Any] = [None] * len(modes)
    pending: list[Future | None] = [None] * len(modes)

    def rank_body(rank: int) -> None:
        mode = modes[rank]
        directory = None
        if mode is not None:
            directory = str(tmp_path / f"r{rank}")
            os.makedirs(directory)
            with open(os.path.join(directory, f"shard_{rank}"), "w") as f:
                f.write(f"rank {rank}")

        def user_upload(checkpoint: str, name: str) -> Any:
            uploads.append((rank, checkpoint))
            return SimpleNamespace(path=checkpoint)

        sealer = ReportSealer(_Link(meetings, rank),  # type: ignore[arg-type]
                              lambda step, path, size: persisted.append((rank, step, path, size)))
        try:
            prepared = sealer.prepare("ray-report1", directory, mode or S, 1, user_upload)
            pending[rank] = _ray_report(barrier, pools[rank], mode, directory,
                                        prepared.upload)
            if prepared.persisted_at_report:
                persisted.append((rank, 1, directory, prepared.sealed_bytes))
        except BaseException as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(len(modes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT_S)
    for pool in pools:
        pool.shutdown(wait=True)
    for rank, future in enumerate(pending):
        if future is not None and future.exception() is not None:
            errors[rank] = future.exception()
    assert errors == [None] * len(modes), errors
    return persisted, uploads


@pytest.mark.parametrize("modes", list(itertools.product(MODES, repeat=2)),
                         ids=lambda m: "-".join(x.value if x else "none" for x in m))
def test_every_pair_of_modes_seals_without_waiting_across_the_barrier(tmp_path, modes):
    persisted, uploads = _run_pair(tmp_path, modes)
    reporting = [r for r, mode in enumerate(modes) if mode is not None]
    if not reporting:
        assert persisted == [] and uploads == []
        return
    writer = reporting[0]
    assert [(r, step) for r, step, _, _ in persisted] == [(writer, 1)]
    assert sorted(r for r, _ in uploads) == [r for r in reporting if modes[r] != N]
    manifest = json.loads((tmp_path / f"r{writer}" / MANIFEST_NAME).read_text())
    # the bytes the manifest seals reach the commit, whichever mode each rank uploads in
    assert persisted[0][3] == sum(f["size_bytes"] for f in manifest["files"]) == 6 * len(reporting)
    assert sorted(f["path"] for f in manifest["files"]) == [f"shard_{r}" for r in reporting]
    assert manifest["metadata"]["reported_by"] == reporting
    for other in reporting[1:]:  # only the writer's directory carries a manifest
        assert not (tmp_path / f"r{other}" / MANIFEST_NAME).exists()


def test_hashing_stays_in_the_upload_thread_only_when_every_checkpoint_is_async():
    assert plan_seal([(0, "ASYNC"), None, (2, "ASYNC")]) == SealPlan(writer=0, deferred=True)
    assert plan_seal([None, (1, "ASYNC")]) == SealPlan(writer=1, deferred=True)
    assert plan_seal([(0, "ASYNC"), (1, "SYNC")]) == SealPlan(writer=0, deferred=False)
    assert plan_seal([(0, "NO_UPLOAD"), (1, "ASYNC")]) == SealPlan(writer=0, deferred=False)
    assert plan_seal([None, None]) == SealPlan(writer=None, deferred=False)


def test_an_async_writer_hashes_in_ray_s_upload_thread(tmp_path):
    d = tmp_path / "r0"
    d.mkdir()
    (d / "model.pt").write_bytes(b"w")
    sealer = ReportSealer(_Link(_Meetings(1), 0), lambda step, path, size: None)  # type: ignore[arg-type]
    prepared = sealer.prepare("ray-report1", str(d), A, 3, lambda c, n: SimpleNamespace(path=c))
    assert not (d / MANIFEST_NAME).exists()  # nothing hashed in the loop
    prepared.upload(str(d), "checkpoint_3")
    assert json.loads((d / MANIFEST_NAME).read_text())["step"] == 3
