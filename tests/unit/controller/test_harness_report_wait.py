"""A rank that reports once more than its peers: the controller says which ranks returned,
the waiting rank's real ``ReportWait`` (rayguard/health/report_wait.py) reads it through its
real link and ends the run with ``UnmatchedReportError``, not retried, in Ray Train's real
controller (rayguard.testing.controller), in milliseconds. Without it the run would wait for
ever (Ray's own test_report_fault_tolerance.py run with RobustTrainer waited 21 minutes)."""

from __future__ import annotations

import rayguard
from rayguard.controller.failure_policy import STOP_REASON_KEY
from rayguard.health.report_wait import CHECK_AFTER_S, ReportWait, ReturnedCheck
from rayguard.run.facts import RETURNED


def guard():
    return rayguard.GuardConfig(numa="off", preflight=False,
                                health=rayguard.HealthConfig(stall_timeout_s=600.0))


def one_more_report_on_rank_0(w):
    """Ranks 1.. report twice and return; rank 0 reports twice, then waits in a third
    report that no peer joins (the wait's heartbeat keeps its watchdog quiet)."""
    if w.step < 1:
        return w.report(loss=1.0)
    if w.rank != 0:
        return w.finish()
    if not hasattr(w, "waiting"):
        check = ReturnedCheck(lambda: w.link.get(RETURNED), rank=w.rank,
                              world_size=w.world_size, clock=w.clock)
        w.waiting = ReportWait(w.heartbeat, check, report=3)
    w.waiting()


def test_the_ranks_that_returned_end_a_report_no_one_joins(harness):
    h = harness(one_more_report_on_rank_0, num_workers=3, guard=guard())
    started = h.clock()
    h.run()
    assert h.state == "ERRORED"
    assert [e["attempt"] for e in h.events("attempt_started")] == [0]  # not retried
    (died,) = h.events("worker_died")
    assert died["rank"] == 0 and died["failure"] == "hang" and not died["retry"] == "retried"
    assert "UnmatchedReportError" in died["details"] and "[1, 2]" in died["details"]
    assert h.coordinator.get(RETURNED) == [1, 2]
    assert h.events("stall_detected") == []  # the wait was progress: the report ended it
    stop = h.coordinator.get(STOP_REASON_KEY)
    assert stop["kind"] == "fatal" and "not retried" in stop["reason"]
    assert h.clock() - started >= CHECK_AFTER_S


def test_a_peer_still_running_keeps_the_wait(harness):
    def rank_2_slow(w):
        if w.rank == 2 and w.ticks < 120:  # a long step: rank 0's report waits for it
            return w.heartbeat()
        one_more_report_on_rank_0(w) if w.rank != 2 or w.step < 1 else w.finish()

    h = harness(rank_2_slow, num_workers=3, guard=guard())
    started = h.clock()
    h.run(lambda h: h.clock() - started > 2 * CHECK_AFTER_S)
    assert h.state == "RUNNING" and h.coordinator.get(RETURNED) == [1]
    h.run()
    assert h.state == "ERRORED" and "[1, 2]" in h.events("worker_died")[0]["details"]


def test_a_failure_after_a_rank_returned_restarts_the_whole_group(harness):
    # live recovery keeps the survivors, but a rank that returned cannot rejoin a replacement
    def rank_2_dies_after_rank_1_returned(w):
        if w.step < 1:
            return w.report(loss=1.0)
        if w.attempt == 0 and w.rank == 1:
            return w.finish()
        if w.attempt == 0 and w.rank == 2 and w.ticks > 4:
            return w.die()
        if w.attempt > 0 or w.rank == 2:
            return w.heartbeat() if w.attempt == 0 else w.finish()
        w.heartbeat()

    h = harness(rank_2_dies_after_rank_1_returned, num_workers=3,
                guard=rayguard.GuardConfig(numa="off", preflight=False, recovery="live")).run()
    assert h.state == "FINISHED"
    (restart,) = h.events("restart")
    assert restart.get("path") is None and "[1] already returned" in restart["fallback"]
