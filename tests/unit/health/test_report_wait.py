"""A rank waiting in ``ray.train.report`` after every other rank returned ends with a clear
error instead of waiting for ever (rayguard/health/report_wait.py); the controller's side,
which ranks returned, is proven through Ray's real controller in
tests/unit/controller/test_harness_report_wait.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rayguard.exceptions import UnmatchedReportError
from rayguard.failures import classify
from rayguard.health.report_wait import (
    CHECK_AFTER_S,
    CHECK_EVERY_S,
    ReportWait,
    ReturnedCheck,
    finished_ranks,
)
from rayguard.testing.fake_workers import Clock


def waiting(returned, *, rank=0, world_size=2):
    clock, reads, beats = Clock(100.0), [], []

    def read():
        reads.append(clock.now)
        return returned() if callable(returned) else returned

    check = ReturnedCheck(read, rank=rank, world_size=world_size, clock=clock)
    wait = ReportWait(lambda: beats.append(1), check, report=3)
    return wait, clock, reads, beats


def test_finished_ranks_are_those_that_returned_without_an_error():
    statuses = {0: SimpleNamespace(running=True, error=None),
                1: SimpleNamespace(running=False, error=None),
                2: SimpleNamespace(running=False, error=ValueError("x")),
                3: SimpleNamespace(running=False, error=None)}
    assert finished_ranks(statuses) == [1, 3]
    assert finished_ranks({}) == []


def test_a_short_wait_asks_nothing_and_stays_progress():
    wait, clock, reads, beats = waiting([1])
    for _ in range(int(CHECK_AFTER_S) - 1):
        clock.now += 1
        wait()
    assert reads == [] and len(beats) == int(CHECK_AFTER_S) - 1


def test_every_other_rank_returned_raises_the_fix():
    wait, clock, reads, _ = waiting([1, 2, 3], rank=0, world_size=4)
    clock.now += CHECK_AFTER_S
    with pytest.raises(UnmatchedReportError) as info:
        wait()
    text = str(info.value)
    assert "rank 0" in text and "report 3" in text and "[1, 2, 3]" in text
    assert "same number of times on every rank" in text
    failure = classify(info.value)
    assert failure.fatal and failure.cause == "hang"  # not retried: a restart does the same


def test_a_peer_still_running_keeps_the_wait_and_asks_again_later():
    returned = [[1]]  # of 3 ranks, rank 2 still runs (a slow step)
    wait, clock, reads, _ = waiting(lambda: returned[0], rank=0, world_size=3)
    clock.now += CHECK_AFTER_S
    wait()
    clock.now += CHECK_EVERY_S / 2
    wait()
    assert len(reads) == 1  # asked once, not again within every_s
    returned[0] = [1, 2]
    clock.now += CHECK_EVERY_S
    with pytest.raises(UnmatchedReportError):
        wait()


def test_an_unknown_answer_keeps_the_wait():
    def fails():
        raise TimeoutError("the coordinator did not answer")

    for answer in (None, fails, [0]):  # not known, no answer, only this rank itself
        wait, clock, reads, _ = waiting(answer)
        clock.now += CHECK_AFTER_S
        wait()
        assert len(reads) == 1


def test_one_rank_alone_never_asks():
    wait, clock, reads, _ = waiting([], world_size=1)
    clock.now += 10 * CHECK_AFTER_S
    wait()
    assert reads == []
