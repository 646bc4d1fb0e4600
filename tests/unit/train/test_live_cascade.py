"""A peer's loss reaches every gloo rank, not only the lost rank's neighbours: real gloo
process groups (8 forked processes), one rank exits while the others wait in an
all-reduce. Each survivor whose collective raised leaves its group with
``leave_broken_group`` (its failed function's frames still hold the group, as a DDP model
does): its connections close, so the ranks blocked with it raise in turn. With only
``destroy_process_group`` the ranks that were not the lost rank's neighbours stay blocked
until their peers' processes exit (minutes later here)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time

import pytest

WORLD = 8
HOLD_S = 120.0  # how long a survivor keeps its process after it left the group


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out: mp.Queue, leave: str) -> None:
    import torch
    import torch.distributed as dist

    from rayguard.train.live import leave_broken_group, leave_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == WORLD - 1:
        time.sleep(0.5)
        os._exit(1)  # the lost rank

    def training_function() -> None:
        group = dist.group.WORLD  # noqa: F841 - what a DDP model holds in the frame
        dist.all_reduce(t)

    held = []
    try:
        training_function()
    except Exception as exc:
        held.append(exc)  # as the worker keeps it while it rejoins (or re-raises it)
        leave_broken_group(exc) if leave == "broken" else leave_group()
        out.put(rank)
    time.sleep(HOLD_S)
    os._exit(0)


def _raised(leave: str, wait_s: float) -> set[int]:
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, port, out, leave), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    raised: set[int] = set()
    end = time.monotonic() + wait_s
    try:
        while len(raised) < WORLD - 1 and time.monotonic() < end:
            try:
                raised.add(out.get(timeout=max(0.1, end - time.monotonic())))
            except queue.Empty:
                break
    finally:
        for p in procs:
            p.kill()
    return raised


@pytest.mark.timeout(200)
def test_every_survivor_leaves_the_collective_not_only_the_neighbours():
    assert _raised("broken", wait_s=60.0) == set(range(WORLD - 1))


@pytest.mark.timeout(200)
def test_a_group_destroyed_but_still_held_keeps_the_others_blocked():
    # the cause: without the frames dropped, the lost rank's neighbours raise, the rest wait
    raised = _raised("plain", wait_s=5.0)
    assert raised and raised != set(range(WORLD - 1)), raised


def _flags_rank(rank: int, port: int, out: mp.Queue) -> None:
    import torch.distributed as dist

    from rayguard.exceptions import PeersLostError
    from rayguard.train.agreement import CollectiveAgreement, Flags

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if rank == 1:  # alive, its connection open, never in the agreement
        time.sleep(HOLD_S)
        os._exit(0)
    asked = time.monotonic()
    agreement = CollectiveAgreement(
        None, heartbeat=lambda: None, poll_s=0.1,
        lost=lambda: "attempt 0 lost rank(s) [1]" if time.monotonic() - asked > 1.0 else None)
    try:
        agreement.agree(Flags(nonfinite=False))
        out.put("returned")
    except PeersLostError as exc:
        out.put(str(exc))
    out.close()
    out.join_thread()  # flushed before the process goes
    os._exit(0)


@pytest.mark.timeout(200)
def test_a_rank_waiting_in_the_report_agreement_leaves_when_the_run_says_a_peer_is_lost():
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_flags_rank, args=(r, port, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        assert out.get(timeout=60) == "attempt 0 lost rank(s) [1]"
    finally:
        for p in procs:
            p.kill()
