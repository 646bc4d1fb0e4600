"""One Decision type for both hosts: the worker's NaN guard and watchdog, a sweep's trial
restarts; the error that ends what failed (StallError for a stall)."""

from __future__ import annotations

import math
import pickle

import pytest

from rayguard.exceptions import HealthError, NonFiniteMetricError, StallError
from rayguard.health.checks import NONFINITE, STALL, Point, Verdict, check_nonfinite, check_stall
from rayguard.health.decisions import (
    CONTINUE,
    FAIL,
    RESTART,
    Decision,
    check_finite,
    stall_decision,
)


def test_worker_nan_guard_uses_the_shared_finite_check():
    d = check_finite({"loss": math.nan, "acc": 0.5}, ("loss",), policy="restart", step=7)
    shared = check_nonfinite("", Point(7, 0.0, {"loss": math.nan}), ("loss",), 0.0)
    assert d.action == RESTART and d.verdict is not None and shared is not None
    assert (d.check, d.verdict.metric, d.verdict.since_iteration) == \
        (shared.check, shared.metric, shared.since_iteration) == (NONFINITE, "loss", 7)
    assert d.reason == "metric 'loss' is nan at step 7" and math.isnan(d.value)


def test_worker_nan_guard_judges_numbers_only():
    # a string or a bool is never a non-finite number in a worker's report
    assert check_finite({"loss": "nan"}, ("loss",), policy="fail") is CONTINUE
    assert check_finite({"loss": True}, ("loss",), policy="fail").ok


def test_one_stall_check_serves_worker_and_sweep():
    assert check_stall("", 0.0, 10.0, 10.0) is None
    worker = check_stall("", 0.0, 10.5, 10.0, bound="startup")
    assert worker is not None and worker.check == "startup"
    assert "start-up timeout 10.0 s" in worker.detail and "after iteration" not in worker.detail
    trial = check_stall("t1", 0.0, 10.5, 10.0, 4, 99.0)
    assert trial is not None and trial.check == STALL and trial.since_iteration == 5
    assert trial.time == 99.0 and trial.detail.endswith("after iteration 4")
    d = stall_decision(worker)
    assert d.action == RESTART and d.reason == worker.detail and d.threshold == 10.0
    assert stall_decision(None) is CONTINUE


@pytest.mark.parametrize("check, error", [
    ("stall", StallError), ("startup", StallError), ("nonfinite", NonFiniteMetricError),
    ("divergence", HealthError), ("memory_growth", HealthError),
])
def test_the_error_that_ends_a_failed_trial_names_the_check(check, error):
    verdict = Verdict("t", check, None, 1.0, 0.5, 3, 0.0, "detail")
    exc = Decision(FAIL, verdict, "trial t failed").error()
    assert type(exc) is error and str(exc) == "trial t failed"
    assert str(pickle.loads(pickle.dumps(exc))) == "trial t failed"


def test_continue_has_no_verdict():
    assert CONTINUE.ok and CONTINUE.check == "" and CONTINUE.value is None
    assert CONTINUE.trial_id == "" and CONTINUE.threshold is None
