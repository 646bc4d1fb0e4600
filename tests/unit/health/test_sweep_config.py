"""SweepHealthConfig: the sweep-only settings live only in their own config; HealthConfig
rejects them with an error that names the field, the value and the SweepHealthConfig call."""

from __future__ import annotations

import pickle

import pytest

from rayguard import ConfigError, HealthConfig
from rayguard.exceptions import UnknownFieldError
from rayguard.health.sweep_config import SWEEP_FIELDS, resolve_sweep_health
from rayguard.tune import SweepHealthConfig


def test_sweep_fields_are_the_seven_series_settings():
    assert SWEEP_FIELDS == ("mode", "divergence_factor", "window", "min_results",
                            "throughput_collapse_fraction", "memory_metrics",
                            "memory_growth_fraction")
    assert not set(SWEEP_FIELDS) & set(HealthConfig.__dataclass_fields__)


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
    with pytest.raises(ConfigError) as err:
        SweepHealthConfig(**kwargs)
    assert f"SweepHealthConfig({field})" in str(err.value) and "Fix:" in str(err.value)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


def test_memory_metrics_given_as_a_string_or_list_become_a_tuple():
    assert SweepHealthConfig(memory_metrics="rss").memory_metrics == ("rss",)
    assert SweepHealthConfig(memory_metrics=["a", "b"]).memory_metrics == ("a", "b")


@pytest.mark.parametrize("name", SWEEP_FIELDS)
def test_health_config_rejects_each_sweep_field_naming_sweep_health_config(name):
    value = getattr(SweepHealthConfig(), name)
    with pytest.raises(UnknownFieldError) as err:
        HealthConfig(**{name: value})
    message = str(err.value)
    assert message.startswith(f"HealthConfig({name}={value!r}): HealthConfig has no field")
    assert (f"Fix: leave them out of HealthConfig; for a sweep pass rayguard.tune.run(..., "
            f"sweep_health=rayguard.tune.SweepHealthConfig({name}={value!r}))") in message
    assert isinstance(err.value, TypeError)  # what Python raises for an unknown keyword
    assert str(pickle.loads(pickle.dumps(err.value))) == message


def test_several_sweep_fields_are_named_in_one_error():
    with pytest.raises(ConfigError) as err:
        HealthConfig(stall_timeout_s=30, window=5, divergence_factor=None)
    assert "HealthConfig(window=5, divergence_factor=None)" in str(err.value)
    assert "SweepHealthConfig(window=5, divergence_factor=None)" in str(err.value)


def test_sweep_health_given_or_left_out():
    sweep = SweepHealthConfig(window=7)
    assert resolve_sweep_health(sweep, "x") is sweep
    assert resolve_sweep_health(None, "x") == SweepHealthConfig()
    with pytest.raises(ConfigError, match="sweep_health="):
        resolve_sweep_health({"window": 7}, "rayguard.tune.run")  # type: ignore[arg-type]


def test_health_callback_takes_the_sweep_settings_from_sweep_health():
    from rayguard.tune import HealthCallback

    callback = HealthCallback(HealthConfig(),
                              sweep_health=SweepHealthConfig(window=5, min_results=3))
    assert callback.sweep_health == SweepHealthConfig(window=5, min_results=3)
    assert HealthCallback(HealthConfig()).sweep_health == SweepHealthConfig()
