"""The start-up bound and the stall bound, decided by each worker's real watchdog on the
harness's clock and acted on by Ray Train's real controller (rayguard.testing.controller).

Proves the decisions of tests/ray/test_startup_bound.py (each test names its twin) and the
stall bound of tests/ray/test_live_replace.py::test_killed_hung_and_raising_workers_are_replaced_alone (its hang). Not covered
here: a real process sleeping with the GIL released, the watchdog's own thread and its wake-up
interval, the SIGKILL that ends the stuck process, and the hang diagnosis among real peers
(tests/ray/test_hang_diagnosis.py).
"""

from __future__ import annotations

from ray.train import FailureConfig

import rayguard


def guard(**health):
    return rayguard.GuardConfig(numa="off", preflight=False,
                                health=rayguard.HealthConfig(**health))


def three_steps(w):
    if w.step >= 2:
        return w.finish()
    w.report(loss=1.0)


def test_a_start_that_never_ends_is_caught_by_the_startup_bound(harness):
    # tests/ray/test_startup_bound.py::test_a_start_that_never_ends_is_caught_by_the_startup_bound
    def stuck_start(w):
        if w.attempt == 0 and w.rank == 0:
            return w.hang()  # never reaches its first step
        three_steps(w)

    h = harness(stuck_start, guard=guard(stall_timeout_s=600.0, startup_timeout_s=8.0)).run()
    (stall,) = h.events("stall_detected")
    assert stall["bound"] == "startup" and stall["rank"] == 0 and stall["attempt"] == 0
    assert "startup_timeout_s" in stall["detail"] and stall["timeout_s"] == 8.0
    assert 8.0 < stall["idle_s"] <= 9.0  # one poll (step_s=1) past the bound
    died = [e for e in h.events("worker_died") if e["rank"] == 0]
    assert [e["failure"] for e in died] == ["hang"]
    assert "killed by rayguard: startup" in died[0]["detail"]
    assert h.state == "FINISHED" and [g.attempt for g in h.groups] == [0, 1]


def test_a_start_slower_than_the_stall_timeout_is_not_a_stall(harness):
    # tests/ray/test_startup_bound.py::test_a_start_slower_than_the_stall_timeout_is_not_a_stall
    def slow_start(w):
        if w.ticks <= 6:  # CUDA/NCCL init, torch.compile: 6 s without a step
            return
        three_steps(w)

    h = harness(slow_start, guard=guard(stall_timeout_s=2.0, startup_timeout_s=600.0)).run()
    kinds = h.kinds()
    assert h.state == "FINISHED" and "stall_detected" not in kinds and "restart" not in kinds


def test_after_the_first_step_the_stall_bound_applies(harness):
    # tests/ray/test_live_replace.py::test_killed_hung_and_raising_workers_are_replaced_alone (the stall decision of its hang)
    def hang_at_step_2(w):
        if w.attempt == 0 and w.rank == 1 and w.step == 2:
            return w.hang()
        if w.step >= 5:
            return w.finish()
        w.report(loss=1.0)

    h = harness(hang_at_step_2, guard=guard(stall_timeout_s=3.0, startup_timeout_s=120.0)).run()
    (stall,) = h.events("stall_detected")
    assert (stall["bound"], stall["rank"], stall["step"]) == ("stall", 1, 2)
    assert "stall_timeout_s" in stall["detail"]
    (died,) = h.events("worker_died")
    assert died["failure"] == "hang" and "killed by rayguard: stall" in died["detail"]
    assert h.state == "FINISHED"


def test_a_start_bound_that_fires_on_every_attempt_uses_rays_budget(harness):
    def never_starts(w):
        w.hang()

    h = harness(never_starts, num_workers=1, guard=guard(startup_timeout_s=5.0),
                failure_config=FailureConfig(max_failures=1)).run()
    assert h.state == "ERRORED"
    assert [e["bound"] for e in h.events("stall_detected")] == ["startup", "startup"]
    assert "crash_loop" not in h.kinds()  # a watchdog kill is a death, never a loop
