"""HealthCallback driven by hand with stand-in trials and a fake clock (no Ray cluster):
verdicts become decisions, applied at the next loop turn through the executor."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest

from rayguard import HealthConfig
from rayguard._ray import tune as executor
from rayguard.tune import SweepHealthConfig
from rayguard.tune import callback as cb


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trial(tid="t1", status="RUNNING"):
    return SimpleNamespace(trial_id=tid, status=status, last_result={},
                           latest_checkpoint_result=None)


@pytest.fixture
def applied(monkeypatch):
    calls = []
    monkeypatch.setattr(executor, "find_controller", lambda: "controller")
    monkeypatch.setattr(executor, "experiment_dir", lambda c: None)
    monkeypatch.setattr(executor, "restart_trial",
                        lambda c, t, ckpt, reason: calls.append(("restart", t.trial_id, ckpt)))
    monkeypatch.setattr(executor, "fail_trial",
                        lambda c, t, reason, error=None: calls.append(("fail", t.trial_id, reason)))
    monkeypatch.setattr(executor, "interrupt_experiment",
                        lambda c: calls.append(("stop",)) or True)
    return calls


def make(**kw):
    clock = Clock()
    health = HealthConfig(**{"stall_timeout_s": 5.0, "max_restarts": 1, **kw})
    return cb.HealthCallback(health, sweep_health=SweepHealthConfig(min_results=3, window=5),
                             is_good_checkpoint=lambda p: True, clock=clock), clock


def report(callback, t, it, loss, clock, ckpt=True):
    clock.now += 1.0
    result = {"training_iteration": it, "loss": loss, "time_this_iter_s": 1.0}
    callback.on_trial_result(iteration=0, trials=[t], trial=t, result=result)
    if ckpt:
        t.latest_checkpoint_result = SimpleNamespace(
            checkpoint=SimpleNamespace(path=f"/ck/{it}"),
            metrics={"training_iteration": it})
        callback.on_trial_save(iteration=0, trials=[t], trial=t)


def test_nan_restarts_from_checkpoint_before_it_then_fails(applied):
    callback, clock = make()
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    for it in range(1, 5):
        report(callback, t, it, 1.0, clock)
    report(callback, t, 5, math.nan, clock)  # a checkpoint came with the NaN result too
    assert applied == []  # decided, not applied inside result handling
    callback.on_step_begin(iteration=1, trials=[t])
    assert applied[0][0] == "restart" and applied[0][2].iteration == 4
    assert callback.status()["t1"].restarts == 1
    assert callback.status()["t1"].verdict.check == "nonfinite"
    callback.on_trial_start(iteration=1, trials=[t], trial=t)
    report(callback, t, 5, math.nan, clock)
    callback.on_step_begin(iteration=2, trials=[t])
    assert applied[1][0] == "fail" and "max_restarts=1" in applied[1][2]
    kinds = [e.kind for e in callback.event_log.events()]
    assert kinds.count("unhealthy") == 2 and "restart" in kinds and "failed" in kinds


def test_stall_detected_by_timer_only_while_running(applied):
    callback, clock = make()
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    report(callback, t, 1, 1.0, clock)
    clock.now += 5.0
    callback.on_step_begin(iteration=1, trials=[t])
    assert applied == []  # exactly the timeout: not yet
    t.status = "PENDING"
    clock.now += 10.0
    callback.on_step_begin(iteration=2, trials=[t])
    assert applied == []  # pending trials do not stall
    t.status = "RUNNING"
    callback.on_step_begin(iteration=3, trials=[t])
    assert applied and applied[0][0] == "restart" and applied[0][2].iteration == 1


def test_adaptive_stall_timeout_uses_slowest_step(applied):
    callback, clock = make(stall_timeout_s=None, stall_timeout_floor_s=2.0,
                           stall_timeout_multiplier=3.0)
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    report(callback, t, 1, 1.0, clock)  # time_this_iter_s = 1.0 -> timeout max(2, 3) = 3
    clock.now += 2.9
    callback.on_step_begin(iteration=1, trials=[t])
    assert applied == []
    clock.now += 0.2
    callback.on_step_begin(iteration=2, trials=[t])
    assert applied[0][0] == "restart"


def test_healthy_trial_and_ended_trial_untouched(applied):
    callback, clock = make()
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    for it in range(1, 10):
        report(callback, t, it, 1.0 / it + 1, clock)
        callback.on_step_begin(iteration=it, trials=[t])
    assert applied == []
    report(callback, t, 10, math.nan, clock)
    t.status = "TERMINATED"
    callback.on_step_begin(iteration=11, trials=[t])
    assert applied == [] and callback.event_log.events(kind="skipped")


def test_stop_request_applied_once(applied):
    callback, _ = make()
    callback.request_stop()
    callback.on_step_begin(iteration=0, trials=[])
    callback.on_step_begin(iteration=1, trials=[])
    assert applied == [("stop",)]


def test_train_checkpoint_path_metric_is_a_checkpoint(applied):
    callback, clock = make()
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    for it in range(1, 4):
        clock.now += 1
        callback.on_trial_result(iteration=0, trials=[t], trial=t, result={
            "training_iteration": it, "loss": 1.0, "checkpoint_path": f"/train/{it}"})
    clock.now += 1
    callback.on_trial_result(iteration=0, trials=[t], trial=t,
                             result={"training_iteration": 4, "loss": math.inf})
    callback.on_step_begin(iteration=1, trials=[t])
    ckpt = applied[0][2]
    assert ckpt.path == "/train/3" and ckpt.source.checkpoint.path == "/train/3"


def test_pickles_and_keeps_state_across_resume(applied):
    callback, clock = make()
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    report(callback, t, 1, 1.0, clock, ckpt=False)
    report(callback, t, 2, math.nan, clock, ckpt=False)
    callback.on_step_begin(iteration=1, trials=[t])
    state = pickle.loads(pickle.dumps(callback.get_state()))
    plain = cb.HealthCallback(HealthConfig())  # as pickled into the Tuner's run config
    plain.on_step_begin(iteration=0, trials=[t])
    plain.on_trial_start(iteration=0, trials=[t], trial=t)
    clone = pickle.loads(pickle.dumps(plain))
    assert clone.status() == {} and len(clone.event_log) == 2
    fresh, _ = make()
    fresh.set_state(state)
    assert fresh._watch["t1"].restarts == 1
    assert [e.kind for e in fresh.event_log.events()] == \
        [e.kind for e in callback.event_log.events()]


def test_a_slow_trial_start_is_not_a_stall_until_the_startup_bound(applied):
    """Before a trial's first result only ``startup_timeout_s`` applies (a trial process
    starting on a loaded machine, data loading); the stall timeout from the first result on."""
    callback, clock = make(stall_timeout_s=5.0, startup_timeout_s=60.0)
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    clock.now += 30.0
    callback.on_step_begin(iteration=1, trials=[t])
    assert applied == []  # 30 s without a result: still starting
    report(callback, t, 1, 1.0, clock)
    clock.now += 5.5
    callback.on_step_begin(iteration=2, trials=[t])
    assert applied and applied[0][0] == "restart"  # after a result: the stall timeout


def test_a_trial_that_never_reports_is_caught_by_the_startup_bound(applied):
    callback, clock = make(stall_timeout_s=5.0, startup_timeout_s=60.0)
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    clock.now += 61.0
    callback.on_step_begin(iteration=1, trials=[t])
    assert applied and applied[0][0] in ("restart", "fail")


def test_a_trial_failed_by_a_stall_ends_with_stall_error(monkeypatch):
    from rayguard.exceptions import StallError

    errors = []
    monkeypatch.setattr(executor, "find_controller", lambda: "controller")
    monkeypatch.setattr(executor, "experiment_dir", lambda c: None)
    monkeypatch.setattr(executor, "fail_trial",
                        lambda c, t, reason, error=None: errors.append((reason, error)))
    callback, clock = make(max_restarts=0)
    t = trial()
    callback.on_step_begin(iteration=0, trials=[t])
    callback.on_trial_start(iteration=0, trials=[t], trial=t)
    report(callback, t, 1, 1.0, clock)
    clock.now += 6.0
    callback.on_step_begin(iteration=1, trials=[t])
    (reason, error), = errors
    assert isinstance(error, StallError) and str(error) == reason and "stall" in reason
