"""The public surface users code against; changing it must be deliberate."""

import pickle

import pytest

import rayguard
from rayguard import GuardConfig, HealthConfig
from rayguard.exceptions import ConfigError


def test_public_names_are_pinned():
    assert sorted(rayguard.__all__) == sorted([
        "CheckpointConfig", "ConfigError", "GuardConfig", "HealthConfig", "RayGuardError", "RobustTrainer",
        "__version__", "train",
    ])
    assert sorted(rayguard.train.__all__) == sorted([
        "ElasticSampler", "GuardContext", "get_context", "heartbeat", "load_state", "report",
        "should_checkpoint",
    ])
    assert sorted(rayguard.tune.__all__) == sorted([
        "HealthCallback", "SweepEvent", "SweepHealthConfig", "SweepNotDoneError", "TrialStatus",
        "TuneRun", "Verdict", "read", "run",
    ])


def test_robust_trainer_is_a_torch_trainer():
    from ray.train.torch import TorchTrainer

    assert issubclass(rayguard.RobustTrainer, TorchTrainer)


@pytest.mark.parametrize("kwargs, needle", [
    ({"seed": -1}, "GuardConfig(seed=-1)"),
    ({"seed": 1.5}, "GuardConfig(seed=1.5)"),
    ({"deterministic": "yes"}, "GuardConfig(deterministic='yes')"),
    ({"health": {"stall_timeout_s": 3}}, "GuardConfig(health="),
    ({"numa": "on"}, "GuardConfig(numa='on')"),
    ({"global_batch_size": 64}, "GuardConfig(micro_batch_size=None)"),
    ({"global_batch_size": 10, "micro_batch_size": 4}, "multiple of micro_batch_size=4"),
    ({"micro_batch_size": 0, "global_batch_size": 8}, "GuardConfig(micro_batch_size=0)"),
    ({"lr_scaling": "cubic"}, "GuardConfig(lr_scaling='cubic')"),
    ({"preflight": 1}, "GuardConfig(preflight=1)"),
    ({"controller_poll_interval_s": 0}, "GuardConfig(controller_poll_interval_s=0)"),
    ({"checkpoint": {"mode": "async"}}, "GuardConfig(checkpoint="),
])
def test_guard_config_errors_name_field_value_and_fix(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        GuardConfig(**kwargs)
    assert needle in str(err.value) and "Fix:" in str(err.value)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


@pytest.mark.parametrize("kwargs, needle", [
    ({"stall_timeout_s": 0}, "HealthConfig(stall_timeout_s=0)"),
    ({"stall_timeout_s": float("inf")}, "HealthConfig(stall_timeout_s=inf)"),
    ({"stall_timeout_multiplier": 0.5}, "stall_timeout_multiplier=0.5"),
    ({"watch_metrics": ("",)}, "watch_metrics"),
    ({"nan_policy": "ignore"}, "nan_policy='ignore'"),
    ({"max_restarts": -1}, "max_restarts=-1"),
    ({"mode": "up"}, "mode='up'"),
    ({"window": 1}, "window=1"),
    ({"divergence_factor": 0.5}, "divergence_factor=0.5"),
    ({"throughput_collapse_fraction": 2.0}, "throughput_collapse_fraction=2.0"),
])
def test_health_config_errors(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        HealthConfig(**kwargs)
    assert needle in str(err.value) and "Fix:" in str(err.value)


def test_health_config_defaults_and_adaptive_timeout():
    h = HealthConfig(watch_metrics=["loss", "val"])
    assert h.watch_metrics == ("loss", "val")
    assert h.stall_timeout_for(None) == h.stall_timeout_floor_s
    assert h.stall_timeout_for(100.0) == 1000.0  # 10 x the slowest step, above the floor
    assert HealthConfig(stall_timeout_s=5).stall_timeout_for(100.0) == 5.0


@pytest.mark.parametrize("kwargs, needle", [
    ({"mode": "background"}, "CheckpointConfig(mode='background')"),
    ({"memory_tier": "yes"}, "CheckpointConfig(memory_tier='yes')"),
    ({"pin_memory": 1}, "CheckpointConfig(pin_memory=1)"),
    ({"finish_timeout_s": 0}, "CheckpointConfig(finish_timeout_s=0)"),
    ({"finish_timeout_s": "1h"}, "CheckpointConfig(finish_timeout_s='1h')"),
    ({"finish_timeout_s": True}, "CheckpointConfig(finish_timeout_s=True)"),
])
def test_checkpoint_config_errors(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        rayguard.CheckpointConfig(**kwargs)
    assert needle in str(err.value) and "Fix:" in str(err.value)
