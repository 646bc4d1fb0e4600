"""A run's logged ``interval_settings`` from an attacker's side (anyone who can write the
run directory's event log): figures CheckpointConfig would refuse, or absurd ones, fall back
to the defaults, so ``rayguard events --goodput`` and the report never advise from them."""

from __future__ import annotations

import pytest

from rayguard.checkpoint.interval import DEFAULT_MTBF_S
from rayguard.checkpoint.interval_advice import MAX_LOGGED_S, checked_settings, recommend_interval


def _log(settings: dict) -> list[dict]:
    events = [{"time": 0.0, "kind": "start", "interval_settings": settings}]
    for i in range(5):
        events.append({"time": 100.0 * (i + 1), "kind": "checkpoint_committed", "attempt": 0,
                       "seconds": 2.0})
    return events


@pytest.mark.parametrize("hostile", [1e300, -5, "abc", "NaN", "nan", float("nan"),
                                     float("inf"), 0, True, None, [1], 10 ** 400])
def test_a_hostile_prior_falls_back_to_the_default(hostile, caplog) -> None:
    advice = recommend_interval(_log({"mtbf_s": hostile}))
    assert advice.mtbf_s == pytest.approx(DEFAULT_MTBF_S + 500.0)
    assert 60.0 <= advice.interval_s <= 3600.0
    assert "interval_settings.mtbf_s" in caplog.text


@pytest.mark.parametrize("settings", [
    {"min_interval_s": 1e300, "max_interval_s": 1e300}, {"min_interval_s": -5},
    {"max_interval_s": "abc"}, {"min_interval_s": 5000.0}, {"max_interval_s": 10.0},
    {"min_interval_s": float("nan"), "max_interval_s": float("inf")}])
def test_hostile_bounds_fall_back_to_the_defaults(settings) -> None:
    advice = recommend_interval(_log(settings))
    assert 60.0 <= advice.interval_s <= 3600.0
    assert advice.line().startswith("checkpoint interval: ")


def test_valid_settings_are_kept_as_the_run_logged_them() -> None:
    valid = {"mtbf_s": 3600.0, "min_interval_s": 0.0, "max_interval_s": 600.0}
    assert checked_settings(valid) == valid
    assert checked_settings({"mtbf_s": MAX_LOGGED_S * 2, "other": 1}) == {}
    advice = recommend_interval(_log({"min_interval_s": 10.0, "max_interval_s": 30.0}))
    assert 10.0 <= advice.interval_s <= 30.0
