"""Progress watchdog and health decisions on a fake clock (no threads needed, except the one
test that checks the thread really fires)."""

import math
import threading

from rayguard import HealthConfig
from rayguard.health.checks import check_stall
from rayguard.health.decisions import check_finite, stall_decision
from rayguard.health.watchdog import Watchdog


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_explicit_timeout_fires_only_after_it():
    clock = Clock()
    wd = Watchdog(HealthConfig(stall_timeout_s=10), on_stall=lambda d: None, clock=clock)
    wd.step_completed()  # the stall timeout applies from the first step on
    clock.t = 9.9
    assert wd.check().ok
    clock.t = 10.1
    d = wd.check()
    assert d.action == "restart" and d.check == "stall" and d.threshold == 10


def test_progress_and_heartbeat_reset_the_timer():
    clock = Clock()
    wd = Watchdog(HealthConfig(stall_timeout_s=5), on_stall=lambda d: None, clock=clock)
    wd.step_completed()
    for t in (4.0, 8.0, 12.0):
        clock.t = t
        wd.heartbeat() if t == 8.0 else wd.step_completed()
        assert wd.check().ok
    clock.t = 17.5
    assert not wd.check().ok


def test_adaptive_timeout_follows_the_slowest_step_above_the_floor():
    clock = Clock()
    health = HealthConfig(stall_timeout_floor_s=30, stall_timeout_multiplier=10)
    wd = Watchdog(health, on_stall=lambda d: None, clock=clock)
    assert wd.bound == ("startup", 1800)  # before any step: the start-up bound
    wd.step_completed()
    clock.t = 1.0
    wd.step_completed()  # a 1 s step -> 10 s, still below the floor
    assert wd.timeout_s == 30
    clock.t = 6.0
    wd.step_completed()  # a 5 s step -> 50 s
    assert wd.timeout_s == 50
    clock.t = 6.0 + 49
    assert wd.check().ok
    clock.t = 6.0 + 51
    assert not wd.check().ok


def test_the_thread_calls_on_stall_once():
    fired = []
    done = threading.Event()

    def on_stall(decision):
        fired.append(decision)
        done.set()

    wd = Watchdog(HealthConfig(stall_timeout_s=0.2), on_stall=on_stall)
    wd.step_completed()
    wd.start()
    assert done.wait(10)
    wd.stop()
    assert len(fired) == 1 and fired[0].check == "stall"


def test_the_thread_ticks_on_every_wake_up_while_progress_goes_on():
    ticks = threading.Semaphore(0)
    wd = Watchdog(HealthConfig(stall_timeout_s=0.5), on_stall=lambda d: None,
                  on_tick=ticks.release)  # a peer's hang diagnosis is answered on a tick
    wd.step_completed()
    wd.start()
    for _ in range(3):  # the bound never fires: heartbeats keep it alive, ticks go on
        wd.heartbeat()
        assert ticks.acquire(timeout=10)
    wd.stop()
    assert not wd.fired


def test_check_finite_watches_only_named_metrics():
    assert check_finite({"loss": 1.0, "other": math.nan}, ("loss",), policy="restart").ok
    d = check_finite({"loss": math.inf}, ("loss",), policy="restart", step=3)
    assert d.action == "restart" and "step 3" in d.reason
    assert check_finite({"loss": math.nan}, ("loss",), policy="fail").action == "fail"
    assert check_finite({"loss": True}, ("loss",), policy="fail").ok


def test_check_stall_boundary():
    assert stall_decision(check_stall("", 0.0, 10.0, 10.0)).ok
    assert not stall_decision(check_stall("", 0.0, 10.01, 10.0)).ok


def test_no_stall_before_the_first_step_only_the_startup_bound():
    """A slow start (CUDA/NCCL init, compilation, a loaded machine) is not a stall: before
    the first completed step only ``startup_timeout_s`` applies, and the decision names it."""
    clock = Clock()
    health = HealthConfig(stall_timeout_s=4, startup_timeout_s=100)
    wd = Watchdog(health, on_stall=lambda d: None, clock=clock)
    clock.t = 50.0
    assert wd.check().ok  # 50 s without a step: fine during start-up
    clock.t = 100.5
    d = wd.check()
    assert d.check == "startup" and d.threshold == 100 and "startup_timeout_s" in d.reason
    wd.step_completed()  # first step: from now on the stall timeout
    clock.t = 104.0
    assert wd.check().ok
    clock.t = 105.0
    d = wd.check()
    assert d.check == "stall" and d.threshold == 4 and "stall_timeout_s" in d.reason


def test_startup_bound_is_validated():
    import pytest

    from rayguard import ConfigError

    with pytest.raises(ConfigError, match="startup_timeout_s"):
        HealthConfig(startup_timeout_s=0)
    with pytest.raises(ConfigError, match="crash_loop_retries"):
        HealthConfig(crash_loop_retries=-1)


def test_one_report_so_far_keeps_the_larger_start_up_bound_with_the_adaptive_timeout():
    # a framework that reports only at its saves: the first interval's length is unknown
    clock = Clock()
    wd = Watchdog(HealthConfig(stall_timeout_floor_s=300, startup_timeout_s=1800),
                  on_stall=lambda d: None, clock=clock)
    wd.step_completed()
    assert wd.bound == ("stall", 1800)
    clock.t = 600.0
    wd.step_completed()  # a 600 s interval measured: 10 x 600 s
    assert wd.bound == ("stall", 6000)
    explicit = Watchdog(HealthConfig(stall_timeout_s=20), on_stall=lambda d: None, clock=clock)
    explicit.step_completed()
    assert explicit.bound == ("stall", 20)  # an explicit timeout applies from the first step


def test_every_optimizer_step_is_a_heartbeat_until_unwatched():
    import torch

    from rayguard.health.stall import watch_optimizer_steps

    beats = []
    handle = watch_optimizer_steps(lambda: beats.append(1))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    opt.step()
    opt.step()
    handle.remove()
    opt.step()
    assert len(beats) == 2


def test_every_optimizer_step_is_counted_beside_its_heartbeat():
    import torch

    from rayguard.health.stall import watch_optimizer_steps
    from rayguard.observe.steps import StepTimer

    beats = []
    timer = StepTimer(interval_s=1e9)
    handle = watch_optimizer_steps(lambda: beats.append(1), timer.optimizer_stepped)
    try:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        for _ in range(3):
            opt.step()
    finally:
        handle.remove()
    summary = timer.on_report(3, {}, 0.0)  # the first report's summary goes at once
    assert len(beats) == 3 and summary is not None and summary["optimizer_steps"] == 3
