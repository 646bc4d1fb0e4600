"""Pure health checks over observations and series (run by sweeps and workers): every
check, both sides of each threshold."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayguard.health import checks, series
from rayguard.health.checks import Point
from rayguard.tune import SweepHealthConfig

H = SweepHealthConfig(min_results=3, window=5, divergence_factor=10.0,
                 throughput_collapse_fraction=0.1, memory_growth_fraction=0.5)


def pts(values, name="loss", start=1, gap=1.0):
    return [Point(start + i, (start + i) * gap, {name: v}) for i, v in enumerate(values)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_detected_in_watched_metric(bad):
    v = checks.check_nonfinite("t", Point(7, 0.0, {"loss": bad}), ("loss",), 1.0)
    assert v is not None and v.check == checks.NONFINITE and v.since_iteration == 7
    assert v.metric == "loss" and v.trial_id == "t" and v.time == 1.0


def test_nonfinite_ignores_unwatched_and_finite():
    assert checks.check_nonfinite("t", Point(1, 0, {"other": math.nan, "loss": 1.0}),
                             ("loss",), 0) is None
    assert checks.check_nonfinite("t", Point(1, 0, {}), ("loss",), 0) is None


def test_is_nonfinite_on_odd_values():
    assert checks.is_nonfinite(float("nan")) and not checks.is_nonfinite(3)
    assert not checks.is_nonfinite("abc") and not checks.is_nonfinite(None)


def test_divergence_min_mode():
    history = pts([1.0, 0.8, 0.6, 0.5])
    assert series.check_divergence("t", history, Point(5, 5, {"loss": 5.9}), H, 0) is None
    v = series.check_divergence("t", history, Point(5, 5, {"loss": 7.0}), H, 0)
    # threshold = 10 x max(best 0.5, median 0.7) = 7.0: equal is not beyond
    assert v is None
    v = series.check_divergence("t", history, Point(5, 5, {"loss": 7.01}), H, 0)
    assert v is not None and v.threshold == pytest.approx(7.0) and v.since_iteration == 5


def test_divergence_uses_outside_best():
    history = pts([1.0, 1.0, 1.0])
    p = Point(4, 4, {"loss": 5.0})
    assert series.check_divergence("t", history, p, H, 0) is None
    assert series.check_divergence("t", history, p, H, 0, best=0.1) is None  # median 1.0 rules
    high_history = pts([0.2, 0.2, 0.2])
    assert series.check_divergence("t", high_history, Point(4, 4, {"loss": 2.5}), H, 0) is not None


def test_divergence_max_mode():
    h = SweepHealthConfig(mode="max", min_results=3, window=5, divergence_factor=10.0)
    history = pts([0.5, 0.8, 0.9])
    # threshold = min(best 0.9, median 0.8) / 10 = 0.08
    assert series.check_divergence("t", history, Point(4, 4, {"loss": 0.09}), h, 0) is None
    v = series.check_divergence("t", history, Point(4, 4, {"loss": 0.07}), h, 0)
    assert v is not None and v.threshold == pytest.approx(0.08)


def test_divergence_needs_min_results_and_positive_values_and_can_be_off():
    assert series.check_divergence("t", pts([1.0, 1.0]), Point(3, 3, {"loss": 1e9}), H, 0) is None
    assert series.check_divergence("t", pts([-1.0, -2.0, -3.0]),
                              Point(4, 4, {"loss": 1e9}), H, 0) is None
    off = SweepHealthConfig(divergence_factor=None, min_results=3)
    assert series.check_divergence("t", pts([1.0] * 5), Point(6, 6, {"loss": 1e9}), off, 0) is None


def test_divergence_skips_nonfinite_history():
    history = pts([1.0, math.nan, 1.0, 1.0])
    assert series.check_divergence("t", history, Point(5, 5, {"loss": 11.0}), H, 0) is not None


def test_stall_threshold_is_strict():
    assert checks.check_stall("t", 10.0, 13.0, 3.0, 4, 0) is None
    v = checks.check_stall("t", 10.0, 13.5, 3.0, 4, 0)
    assert v is not None and v.check == checks.STALL and v.since_iteration == 5
    assert v.value == pytest.approx(3.5) and v.threshold == 3.0


def test_intervals_prefer_reported_step_time():
    p = [Point(1, 0.0, {}), Point(2, 5.0, {}, interval_s=1.5), Point(3, 6.0, {})]
    assert series.intervals(p) == [1.5, 1.0]


def _timed(gaps):
    out, t = [Point(1, 0.0, {})], 0.0
    for i, g in enumerate(gaps):
        t += g
        out.append(Point(i + 2, t, {}))
    return out


def test_throughput_collapse_needs_three_slow_results():
    assert series.check_throughput("t", _timed([1.0] * 5 + [20.0, 20.0]), H, 0) is None
    v = series.check_throughput("t", _timed([1.0] * 5 + [20.0, 20.0, 20.0]), H, 0)
    assert v is not None and v.check == checks.THROUGHPUT
    assert v.value == pytest.approx(0.05) and v.threshold == pytest.approx(0.1)
    assert v.since_iteration == 7  # first of the three slow results


def test_throughput_sub_second_jitter_is_not_a_collapse():
    fast = _timed([0.001] * 5 + [0.4, 0.4, 0.4])
    assert series.check_throughput("t", fast, H, 0) is None
    assert series.recent_count(SweepHealthConfig(window=20)) == 5


def test_throughput_healthy_and_edge():
    assert series.check_throughput("t", _timed([1.0] * 5 + [9.0, 9.0, 9.0]), H, 0) is None
    assert series.check_throughput("t", _timed([1.0, 20, 20, 20]), H, 0) is None  # too short
    off = SweepHealthConfig(throughput_collapse_fraction=None, min_results=3, window=5)
    assert series.check_throughput("t", _timed([1.0] * 5 + [99.0] * 3), off, 0) is None


def test_memory_growth():
    rising = pts([100, 110, 120, 140, 160], name="memory_bytes")
    v = series.check_memory("t", rising, H, 0)
    assert v is not None and v.metric == "memory_bytes" and v.value == pytest.approx(0.6)
    assert v.since_iteration == 1
    slow = pts([100, 110, 120, 130, 140], name="memory_bytes")
    assert series.check_memory("t", slow, H, 0) is None  # +40% < 50%
    flat_once = pts([100, 130, 130, 160, 190], name="memory_bytes")
    assert series.check_memory("t", flat_once, H, 0) is None  # not rising at every result
    assert series.check_memory("t", rising[:4], H, 0) is None  # shorter than the window
    gpu = pts([1, 2, 3, 4, 5], name="gpu_memory_bytes")
    assert series.check_memory("t", gpu, H, 0).metric == "gpu_memory_bytes"


def test_check_result_order():
    history = pts([1.0, 1.0, 1.0, 1.0])
    assert series.check_result("t", history, Point(5, 5, {"loss": math.nan}), H, 0).check \
        == checks.NONFINITE
    assert series.check_result("t", history, Point(5, 5, {"loss": 50.0}), H, 0).check \
        == checks.DIVERGENCE
    assert series.check_result("t", history, Point(5, 5, {"loss": 0.9}), H, 0) is None


def test_numeric_metrics():
    got = checks.numeric_metrics({"loss": 1, "a": "x", "b": True, "m": math.nan, "n": None},
                            ("loss", "a", "b", "m", "n", "missing"))
    assert got["loss"] == 1.0 and math.isnan(got["m"]) and set(got) == {"loss", "m"}


@given(st.lists(st.floats(min_value=0.01, max_value=100), min_size=3, max_size=30))
def test_no_divergence_within_factor(values):
    """A value no worse than the worst seen so far never diverges when the spread of the
    series stays within the factor."""
    if max(values) > 10 * min(values):
        return
    history = pts(values)
    p = Point(len(values) + 1, 0, {"loss": max(values)})
    assert series.check_divergence("t", history, p, H, 0) is None


@given(st.lists(st.floats(min_value=0.01, max_value=10), min_size=8, max_size=40))
def test_steady_gaps_never_collapse(gaps):
    if max(gaps) > 9 * min(gaps):
        return
    assert series.check_throughput("t", _timed(gaps), H, 0) is None
