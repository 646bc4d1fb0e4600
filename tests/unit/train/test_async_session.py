"""A one-rank worker session in async checkpoint mode, without Ray (no coordinator; what
would be forwarded to ray.train.report is recorded): report returns before the save
persists, a background failure is raised at the next report, the function's end waits."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
import torch

import rayguard
from rayguard.checkpoint import fsio, verify
from rayguard.exceptions import CheckpointError
from rayguard.train import forwarding as forwarding_mod
from rayguard.train.context import GuardContext
from rayguard.train.session import WorkerSession
from rayguard.train.setup import build_session
from rayguard.train.store import LocalStore


@pytest.fixture
def forwarded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict, str | None]]:
    calls: list[tuple[dict, str | None]] = []
    monkeypatch.setattr(forwarding_mod, "_forward", lambda report, m, path, fs: calls.append((m, path)))
    return calls


def _session(run_dir: Path, mode: str = "async") -> WorkerSession:
    ctx = GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       node_id="n0", device=torch.device("cpu"), seed=0, attempt=0,
                       run_dir=str(run_dir))
    guard = rayguard.GuardConfig(checkpoint=rayguard.CheckpointConfig(mode=mode), numa="off")
    return build_session(ctx, guard, None, (), store=LocalStore(str(run_dir)))


def _flush(session: WorkerSession) -> None:
    session.forwarder.flush(timeout_s=30)


def test_report_returns_before_the_save_persists_and_keeps_the_snapshot(tmp_path, forwarded):
    session = _session(tmp_path)
    opened, release = threading.Event(), threading.Event()

    def hold(phase: str, path: str) -> None:
        if phase == "shard-opened":
            opened.set()
            release.wait()

    w = torch.zeros(1000)
    previous = fsio.set_phase_hook(hold)
    try:
        session.report({"loss": 1.0}, state={"w": w, "step": 1}, step=1)
        assert opened.wait(30)  # persisting in the background ...
        assert session.async_checkpoints.in_flight  # ... while the loop goes on
        w.add_(5.0)  # the loop changes its tensors: the snapshot does not
        release.set()
        session.finish()  # the function returned: waits for the commit
    finally:
        fsio.set_phase_hook(previous)
    _flush(session)
    path = tmp_path / "checkpoint_000000001_a0"
    assert verify(path).ok
    assert forwarded[-1][1] == str(path)  # handed to Ray Train with the final report
    state = session.load_state()
    assert torch.equal(state["w"], torch.zeros(1000)) and state["step"] == 1
    session.close()


def test_a_background_failure_is_raised_at_the_next_report(tmp_path, forwarded):
    session = _session(tmp_path)
    session.report({"loss": 1.0}, state={"w": torch.ones(10), "step": 1}, step=1)

    def full(path: str, offset: int, nbytes: int) -> None:
        if "checkpoint_000000002" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    previous = fsio.set_write_fault_hook(full)
    try:
        session.report({"loss": 1.0}, state={"w": torch.full((10,), 2.0), "step": 2}, step=2)
        while session.async_checkpoints.in_flight:  # failed in the background by now ...
            time.sleep(0.01)
        with pytest.raises(CheckpointError) as err:  # ... and raised at the next report
            session.report({"loss": 1.0}, step=3)
    finally:
        fsio.set_write_fault_hook(previous)
    assert "checkpoint of step 2 was not saved (earlier checkpoints are intact)" in str(err.value)
    assert "No space left on device" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint_")) == [
        "checkpoint_000000001_a0"]
    assert torch.equal(session.load_state()["w"], torch.ones(10))
    session.close()


def test_the_next_report_raises_even_when_the_failure_is_still_in_flight(tmp_path, forwarded):
    session = _session(tmp_path)
    release = threading.Event()

    def fail_late(path: str, offset: int, nbytes: int) -> None:
        release.wait()
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    previous = fsio.set_write_fault_hook(fail_late)
    try:
        session.report({"loss": 1.0}, state={"w": torch.ones(10), "step": 1}, step=1)
        session.async_checkpoints._heartbeat = release.set  # released while report waits
        with pytest.raises(CheckpointError, match="Input/output error"):
            # a state at the next report waits for the one in flight (back-pressure)
            session.report({"loss": 1.0}, state={"w": torch.ones(10), "step": 2}, step=2)
    finally:
        fsio.set_write_fault_hook(previous)
    assert session.async_checkpoints.waits == 1
    session.close()


def test_sync_mode_forwards_each_checkpoint_with_its_report(tmp_path, forwarded):
    session = _session(tmp_path, mode="sync")
    session.report({"loss": 1.0}, state={"w": torch.ones(3), "step": 1}, step=1)
    session.finish()
    _flush(session)
    assert forwarded == [({"loss": 1.0}, str(tmp_path / "checkpoint_000000001_a0"))]
    session.close()




def test_the_run_summary_counts_the_blocked_time_of_async_checkpoints() -> None:
    from rayguard.observe.timeline import build_run

    events = [
        {"kind": "start", "time": 0.0},
        {"kind": "checkpoint_committed", "time": 1.0, "step": 1, "seconds": 3.0, "bytes": 10,
         "mode": "async", "blocked_s": 0.25, "backpressure_s": 0.0},
        {"kind": "checkpoint_committed", "time": 2.0, "step": 2, "seconds": 3.0, "bytes": 10,
         "mode": "async", "blocked_s": 1.5, "backpressure_s": 1.25},
        {"kind": "checkpoint_committed", "time": 3.0, "step": 3, "seconds": 2.0, "bytes": 10},
        {"kind": "finished", "time": 4.0},
    ]
    summary = build_run(events)["summary"]
    assert summary["checkpoint_blocked_s"] == 0.25 + 1.5 + 2.0  # a sync one blocks throughout
    assert summary["checkpoint_backpressure_s"] == 1.25
