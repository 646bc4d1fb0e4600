"""The per-report agreement: flags, when the checkpoint protocol runs, and a real gloo
all-reduce between two processes (a rank that arrives late is waited for, with heartbeats)."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time

from rayguard.train.agreement import (
    Flags,
    GatherAgreement,
    LocalAgreement,
    make_agreement,
    merge_all,
    needs_protocol,
)


def test_merge_is_an_or_per_flag():
    assert merge_all([Flags(), Flags(notice=True), Flags(state=True)]) == Flags(True, False, True)
    assert merge_all([Flags(), Flags()]) == Flags()


def test_only_reports_with_a_state_or_the_first_one_run_the_protocol():
    assert not needs_protocol(Flags(), first=False, world_size=8)
    assert not needs_protocol(Flags(notice=True), first=False, world_size=8)
    assert needs_protocol(Flags(state=True), first=False, world_size=8)
    assert needs_protocol(Flags(sharded=True), first=False, world_size=1)
    assert needs_protocol(Flags(), first=True, world_size=2)  # model preflight facts
    assert not needs_protocol(Flags(), first=True, world_size=1)


def test_world_size_one_agrees_with_itself():
    agreement = make_agreement(1, gather=None, heartbeat=lambda: None)  # type: ignore[arg-type]
    assert isinstance(agreement, LocalAgreement)
    assert agreement.agree(Flags(state=True)) == Flags(state=True)


def test_without_a_process_group_flags_go_through_the_gather():
    calls = []

    def gather(tag, value):
        calls.append(tag)
        return [value, (False, False, True)]

    agreement = make_agreement(2, gather, heartbeat=lambda: None)
    assert isinstance(agreement, GatherAgreement)
    assert agreement.agree(Flags(state=True)) == Flags(state=True, notice=True)
    agreement.barrier()
    assert calls == ["flags1", "barrier2"]


def _rank(rank: int, init_file: str, late_s: float, out, done=None) -> None:
    import torch.distributed as dist

    from rayguard.exceptions import UnmatchedReportError
    from rayguard.health.report_wait import ReturnedCheck

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    beats = []
    agreement = make_agreement(2, gather=None, heartbeat=lambda: beats.append(1))  # type: ignore[arg-type]
    if rank == 1:
        time.sleep(late_s)
    first = agreement.agree(Flags(notice=rank == 1))
    second = agreement.agree(Flags())
    third = agreement.agree(Flags(interval=rank == 0))  # rank 0's interval policy: due
    fourth = agreement.agree(Flags(nonfinite=rank == 1))  # rank 1 saw a NaN (recovery="live")
    agreement.barrier()
    unmatched = ""
    if rank == 0:  # one report more than rank 1, which "returned" (alive, in no collective)
        check = ReturnedCheck(lambda: [1], rank=0, world_size=2, check_after_s=1.0)
        last = make_agreement(2, gather=None, heartbeat=lambda: None, stuck=check)  # type: ignore[arg-type]
        try:
            last.agree(Flags())
        except UnmatchedReportError as exc:
            unmatched = str(exc)
        done.set()
    else:
        done.wait(120)
    out.put((rank, tuple(first), tuple(second), len(beats), type(agreement).__name__,
             tuple(third), tuple(fourth), unmatched))
    if rank == 1:
        dist.destroy_process_group()


def test_a_gloo_all_reduce_agrees_and_waiting_for_a_late_rank_is_a_heartbeat():
    # and a wait no rank will join (every other rank returned) ends with UnmatchedReportError
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        done = ctx.Event()
        procs = [ctx.Process(target=_rank, args=(r, init_file, 2.5, out, done)) for r in range(2)]
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    for rank, first, second, _beats, kind, third, fourth, _unmatched in results:
        assert kind == "CollectiveAgreement"
        # five flags: state, sharded, notice, interval, nonfinite
        assert first == (False, False, True, False, False), rank  # rank 1's notice reached rank 0
        assert second == (False, False, False, False, False)
        assert third == (False, False, False, True, False), rank  # rank 0's interval reached rank 1
        assert fourth == (False, False, False, False, True), rank  # rank 1's NaN reached rank 0
    assert results[0][3] >= 1  # rank 0 waited > 1 s for rank 1 and heartbeat meanwhile
    # rank 0's extra agreement, rank 1 returned: ended by the check, not waited for ever
    assert "rank 0 has waited" in results[0][7] and "the ranks' agreement" in results[0][7]
