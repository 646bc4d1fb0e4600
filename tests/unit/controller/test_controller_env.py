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
