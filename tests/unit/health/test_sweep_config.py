"""SweepHealthConfig: the sweep-only settings in their own config; HealthConfig still accepts
them for rayguard.tune.run, and RobustTrainer says it does not use them."""

from __future__ import annotations

import pickle
import warnings

import pytest

import rayguard
from rayguard import ConfigError, HealthConfig
from rayguard.health.sweep_config import SWEEP_FIELDS, resolve_sweep_health
from rayguard.tune import SweepHealthConfig


def test_sweep_fields_are_the_seven_series_settings():
    assert SWEEP_FIELDS == ("mode", "divergence_factor", "window", "min_results",
                            "throughput_collapse_fraction", "memory_metrics",
                            "memory_growth_fraction")
    assert set(SWEEP_FIELDS) <= set(HealthConfig.__dataclass_fields__)


@pytest.mark.parametrize("kwargs, field", [
    ({"mode": "up"}, "mode='up'"),
    ({"window": 1}, "window=1"),
    ({"min_results": True}, "min_results=True"),
    ({"divergence_factor": 1.0}, "divergence_factor=1.0"),
    ({"throughput_collapse_fraction": 1.5}, "throughput_collapse_fraction=1.5"),
    ({"memory_growth_fraction": 0}, "memory_growth_fraction=0"),
    ({"memory_metrics": ("",)}, "memory_metrics=('',)"),
])
def test_errors_name_the_owner_field_value_and_fix(kwargs, field):
    for owner in (SweepHealthConfig, HealthConfig):
        with pytest.raises(ConfigError) as err:
            owner(**kwargs)
        assert f"{owner.__name__}({field})" in str(err.value) and "Fix:" in str(err.value)
        assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


def test_memory_metrics_given_as_a_string_or_list_become_a_tuple():
    assert SweepHealthConfig(memory_metrics="rss").memory_metrics == ("rss",)
    assert HealthConfig(memory_metrics=["a", "b"]).memory_metrics == ("a", "b")


def test_a_health_config_with_sweep_fields_keeps_working_for_a_sweep():
    health = HealthConfig(window=5, min_results=3, mode="max")
    assert health.sweep_fields_set() == {"window": 5, "min_results": 3, "mode": "max"}
    resolved = resolve_sweep_health(health, None, "rayguard.tune.run")
    assert resolved == SweepHealthConfig(window=5, min_results=3, mode="max")
    assert resolve_sweep_health(HealthConfig(), None, "x") == SweepHealthConfig()


def test_sweep_health_given_on_its_own_is_used():
    sweep = SweepHealthConfig(window=7)
    assert resolve_sweep_health(HealthConfig(stall_timeout_s=5), sweep, "x") is sweep


def test_sweep_fields_given_twice_is_an_error_naming_them():
    with pytest.raises(ConfigError) as err:
        resolve_sweep_health(HealthConfig(window=5), SweepHealthConfig(window=7),
                             "rayguard.tune.run")
    assert "rayguard.tune.run(health=" in str(err.value) and "window" in str(err.value)
    assert "Fix: move window into sweep_health" in str(err.value)
    with pytest.raises(ConfigError, match="sweep_health="):
        resolve_sweep_health(HealthConfig(), {"window": 7}, "rayguard.tune.run")  # type: ignore[arg-type]


def test_the_same_settings_in_both_places_are_no_conflict():
    # rayguard.tune.run resolves them once and hands both to its HealthCallback
    health = HealthConfig(window=5, min_results=3, memory_growth_fraction=None)
    resolved = resolve_sweep_health(health, None, "rayguard.tune.run")
    assert resolve_sweep_health(health, resolved, "HealthCallback") is resolved


def test_health_callback_takes_either_config():
    from rayguard.tune import HealthCallback

    old = HealthCallback(HealthConfig(window=5, min_results=3))
    new = HealthCallback(HealthConfig(), sweep_health=SweepHealthConfig(window=5, min_results=3))
    assert old.sweep_health == new.sweep_health == SweepHealthConfig(window=5, min_results=3)


def test_tune_run_rejects_sweep_fields_given_twice_before_starting_anything():
    from rayguard.tune import run

    with pytest.raises(ConfigError, match="window"):
        run(lambda config: None, health=HealthConfig(window=5),
            sweep_health=SweepHealthConfig(window=6))


def test_robust_trainer_warns_about_sweep_fields_it_does_not_use():
    guard = rayguard.GuardConfig(health=HealthConfig(window=5, divergence_factor=None))
    with pytest.warns(UserWarning) as caught:
        rayguard.RobustTrainer(lambda: None, guard_config=guard)
    (message,) = [str(w.message) for w in caught if "sweep" in str(w.message)]
    assert "HealthConfig(divergence_factor=None, window=5)" in message
    assert "RobustTrainer does not use them" in message
    assert "sweep_health=rayguard.tune.SweepHealthConfig(divergence_factor=None, window=5)" \
        in message


def test_robust_trainer_is_quiet_without_sweep_fields():
    guard = rayguard.GuardConfig(health=HealthConfig(stall_timeout_s=30, max_restarts=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rayguard.RobustTrainer(lambda: None, guard_config=guard)
    assert not [w for w in caught if "sweep" in str(w.message)]
