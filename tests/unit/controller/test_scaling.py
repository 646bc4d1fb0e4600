"""The Ray scaling adapter, without a cluster: size rounding, fixed-size checks, pickling."""

from __future__ import annotations

import pickle

import pytest
from ray.train import ScalingConfig
from ray.train.v2._internal.execution.scaling_policy import (
    FixedScalingPolicy,
    NoopDecision,
    ResizeDecision,
)

from rayguard._ray.train import reserved_resources
from rayguard.controller.scaling import ValidSizeElasticPolicy, make_scaling_policy, valid_sizes_for
from rayguard.exceptions import ConfigError


def reserved(cpus_per_node: list[int]):
    """Reservations in the shape the installed Ray's coordinator returns."""
    return reserved_resources([{"CPU": float(c)} for c in cpus_per_node])


def test_rounds_down_to_largest_valid_size() -> None:
    sc = ScalingConfig(num_workers=(1, 8), resources_per_worker={"CPU": 1})
    policy = make_scaling_policy(sc, valid_sizes_for(sc, global_batch_size=64, micro_batch_size=4))
    assert isinstance(policy, ValidSizeElasticPolicy) and policy.valid_sizes == [1, 2, 4, 8]
    assert policy._count_possible_workers(reserved([1, 1, 1])) == 2
    assert policy._count_possible_workers(reserved([2, 2, 1, 1, 1])) == 4
    assert policy._count_possible_workers(reserved([4, 4, 4])) == 8  # capped at max_workers


def test_waits_below_the_smallest_valid_size() -> None:
    sc = ScalingConfig(num_workers=(2, 6), resources_per_worker={"CPU": 1})
    policy = make_scaling_policy(sc, valid_sizes_for(sc, 24, 4))  # valid: 2, 3, 6
    assert policy._count_possible_workers(reserved([1])) == 0
    assert policy._count_possible_workers(reserved([1, 1, 1, 1, 1])) == 3

    # the decision path: below the smallest valid size Ray waits (NoopDecision)
    policy._maybe_send_resource_request = lambda: None  # type: ignore[method-assign]
    policy._get_reserved_resources = lambda: reserved([1])  # type: ignore[method-assign]
    assert isinstance(policy.make_decision_for_non_running_worker_group(), NoopDecision)
    policy._get_reserved_resources = lambda: reserved([1] * 5)  # type: ignore[method-assign]
    decision = policy.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 3


def test_fixed_size_is_checked() -> None:
    ok = ScalingConfig(num_workers=4)
    assert isinstance(make_scaling_policy(ok, valid_sizes_for(ok, 64, 4)), FixedScalingPolicy)
    bad = ScalingConfig(num_workers=3)
    with pytest.raises(ConfigError, match=r"num_workers=3.*valid world sizes: \[1, 2, 4, 8, 16\]"):
        valid_sizes_for(bad, 64, 4)
    with pytest.raises(ConfigError, match=r"num_workers=3"):
        make_scaling_policy(bad, [1, 2, 4])


def test_elastic_range_without_valid_size() -> None:
    sc = ScalingConfig(num_workers=(3, 3))
    with pytest.raises(ConfigError, match=r"no world size in \[3, 3\]"):
        valid_sizes_for(sc, 64, 4)
    with pytest.raises(ConfigError, match="valid_sizes"):
        make_scaling_policy(sc, [])


def test_policy_pickles_for_the_controller_actor() -> None:
    sc = ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 1})
    policy = pickle.loads(pickle.dumps(make_scaling_policy(sc, [1, 2, 4])))
    assert policy.valid_sizes == [1, 2, 4] and policy._count_possible_workers(reserved([1, 1, 1])) == 2


def test_accepts_a_guard_config() -> None:
    from rayguard.config import GuardConfig

    sc = ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 1})
    policy = make_scaling_policy(sc, GuardConfig(global_batch_size=12, micro_batch_size=2))
    assert isinstance(policy, ValidSizeElasticPolicy) and policy.valid_sizes == [1, 2, 3]
    assert not isinstance(make_scaling_policy(sc, GuardConfig()), ValidSizeElasticPolicy)
    with pytest.raises(ConfigError, match="num_workers=3"):
        make_scaling_policy(ScalingConfig(num_workers=3), GuardConfig(global_batch_size=8, micro_batch_size=2))


class _FakeCoordinator:
    """Stands in for Ray's autoscaling coordinator: reservations over a mutable node list."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.recompute_calls = 0
        outer = self

        class _Method:
            @staticmethod
            def remote(requester_id: str, recompute: bool = False):
                outer.recompute_calls += recompute
                return reserved(outer.nodes)

        self.get_reserved_resources = _Method()


def test_restart_after_node_loss_uses_a_fresh_view(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from rayguard._ray import train as ray_train

    sc = ScalingConfig(num_workers=(1, 3), resources_per_worker={"CPU": 1}, elastic_resize_monitor_interval_s=0)
    policy = make_scaling_policy(sc, [1, 2, 3])
    coordinator = _FakeCoordinator([1, 1, 1])
    policy._requester_id = "train-x"
    policy._coordinator_client = SimpleNamespace(_autoscaling_coordinator=coordinator)  # type: ignore[assignment]
    policy._maybe_send_resource_request = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(ray_train.ray, "get", lambda value, timeout=None: value)

    running = SimpleNamespace(start_time=float("-inf"), num_workers=3)
    assert isinstance(policy.make_decision_for_running_worker_group(running, None), NoopDecision)  # type: ignore[arg-type]
    coordinator.nodes = [1, 1]  # a node dies; the group fails at once (well within Ray's 1 s cache)
    decision = policy.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2
    assert coordinator.recompute_calls == 2
