"""RobustTrainer pins the controller, the actors it starts and the workers to the cluster fit()
runs on (RAY_ADDRESS), through what Ray Train itself copies from the driver."""

from __future__ import annotations

import os

from ray.train.v2._internal.constants import get_env_vars_to_propagate

import rayguard
from rayguard._ray.train import controller_env


def test_the_controller_gets_the_variables_and_the_driver_is_restored(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert "RAY_ADDRESS" not in get_env_vars_to_propagate()
    with controller_env({"RAY_ADDRESS": "10.0.0.1:6379"}):
        # what Ray Train puts into the controller's runtime_env when it starts it
        assert get_env_vars_to_propagate()["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert "RAY_ADDRESS" not in get_env_vars_to_propagate()
    assert "RAY_ADDRESS" not in os.environ


def test_a_drivers_own_ray_address_comes_back(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with controller_env({"RAY_ADDRESS": "10.0.0.1:6379"}):
        assert os.environ["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert os.environ["RAY_ADDRESS"] == "auto"


def test_workers_get_the_address_unless_the_user_chose_one(monkeypatch):
    from ray.train import RunConfig

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    trainer = rayguard.RobustTrainer(lambda: None)
    trainer._cluster_address = "10.0.0.1:6379"
    trainer._restore_env(trainer._set_env())
    assert trainer._rc.worker_runtime_env["env_vars"]["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert trainer.controller_env_vars() == {"RAY_ADDRESS": "10.0.0.1:6379"}
    mine = rayguard.RobustTrainer(lambda: None, run_config=RunConfig(
        worker_runtime_env={"env_vars": {"RAY_ADDRESS": "10.0.0.2:6379"}}))
    mine._cluster_address = "10.0.0.1:6379"
    mine._restore_env(mine._set_env())
    assert mine._rc.worker_runtime_env["env_vars"]["RAY_ADDRESS"] == "10.0.0.2:6379"


def test_a_run_config_reused_for_two_trainers_is_never_changed(monkeypatch):
    """fit() writes RAY_ADDRESS and the spare's variables into the workers' env_vars: into
    its own copy, so the caller's RunConfig (reused for a second trainer) keeps its values,
    and a second fit() of one trainer starts from the user's values again (its own spare)."""
    from ray.train import RunConfig, ScalingConfig

    from rayguard._ray.spare import SPARE_DIR_ENV

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    user_env = {"env_vars": {"MY_FLAG": "1"}}
    shared = RunConfig(worker_runtime_env=user_env)
    live = rayguard.GuardConfig(recovery="live")
    first = rayguard.RobustTrainer(lambda: None, run_config=shared, guard_config=live,
                                   scaling_config=ScalingConfig(num_workers=2))
    first._cluster_address = "10.0.0.1:6379"
    first._restore_env(first._set_env())
    seen = dict(first._rc.worker_runtime_env["env_vars"])
    assert seen["RAY_ADDRESS"] == "10.0.0.1:6379" and seen["MY_FLAG"] == "1"
    assert SPARE_DIR_ENV in seen
    assert user_env == {"env_vars": {"MY_FLAG": "1"}}
    assert shared.worker_runtime_env == {"env_vars": {"MY_FLAG": "1"}}
    first._cluster_address = "10.0.0.9:6379"  # a second fit() of the same trainer
    first._restore_env(first._set_env())
    again = first._rc.worker_runtime_env["env_vars"]
    assert again["RAY_ADDRESS"] == "10.0.0.9:6379" and again[SPARE_DIR_ENV] != seen[SPARE_DIR_ENV]
    second = rayguard.RobustTrainer(lambda: None, run_config=shared)
    second._restore_env(second._set_env())
    assert "RAY_ADDRESS" not in second._rc.worker_runtime_env.get("env_vars", {})
    assert SPARE_DIR_ENV not in second._rc.worker_runtime_env.get("env_vars", {})
