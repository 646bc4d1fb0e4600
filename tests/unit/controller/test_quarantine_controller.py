"""The quarantine in Ray Train's controller, without a cluster: deaths counted against their
nodes through the run's real coordinator (in process), the next group's label selectors, the
elastic policy counting only admitted nodes, and a fixed-size run waiting with a message."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import ray
from ray.exceptions import ActorDiedError
from ray.train import ScalingConfig
from ray.train.v2._internal.execution.scaling_policy import NoopDecision, ResizeDecision
from ray.train.v2._internal.execution.worker_group.state import WorkerGroupContext

from rayguard._ray.train import reserved_resources
from rayguard.controller import fence as fence_module
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.controller.fence import FencedFixedPolicy, FenceView, wait_message
from rayguard.controller.scaling import make_scaling_policy
from rayguard.health.quarantine import NodeFailure
from rayguard.placement.exclude import NODE_ID_LABEL
from rayguard.run.coordinator import RunCoordinator

from .conftest import InProcessHandle
from .test_callbacks import status

A, B = "a" * 56, "b" * 56


@pytest.fixture
def fenced(tmp_path, monkeypatch) -> InProcessHandle:
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0}},
        {"NodeID": A, "Alive": True, "Resources": {"CPU": 2.0}},
        {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 8.0}}])
    return InProcessHandle(RunCoordinator(str(tmp_path / "events.jsonl"), fence={
        "quarantine_after": 2, "path": str(tmp_path / "rayguard_quarantine.json")}))


def context(num_workers: int, label_selector=None) -> WorkerGroupContext:
    return WorkerGroupContext(run_attempt_id="x", train_fn_ref=None, num_workers=num_workers,  # type: ignore[arg-type]
                              resources_per_worker={"CPU": 1.0}, label_selector=label_selector)


def group(*nodes: str) -> SimpleNamespace:
    workers = [SimpleNamespace(metadata=SimpleNamespace(node_id=n)) for n in nodes]
    return SimpleNamespace(get_workers=lambda: workers)


def test_deaths_count_per_attempt_and_the_next_group_leaves_the_node_out(fenced) -> None:
    callback = RayGuardCallback(fenced, quarantine=True)
    for _ in range(2):
        ctx = context(2, [{"zone": "z"}, {}])
        callback.before_worker_group_start(ctx)
        assert ctx.label_selector == [{"zone": "z"}, {}]  # nothing quarantined yet
        callback.after_worker_group_start(group(A, A))
        callback.after_worker_group_poll_status(status({0: ActorDiedError(), 1: ActorDiedError()}))
    assert fenced.target.excluded_nodes() == [A]
    ctx = context(2, [{"zone": "z"}, {}])
    callback.before_worker_group_start(ctx)
    assert ctx.label_selector == [{"zone": "z", NODE_ID_LABEL: f"!in({A})"},
                                  {NODE_ID_LABEL: f"!in({A})"}]
    ctx = context(1)
    callback.before_worker_group_start(ctx)
    assert ctx.label_selector == [{NODE_ID_LABEL: f"!in({A})"}]


def test_errors_that_say_nothing_about_the_node_are_not_counted(fenced) -> None:
    callback = RayGuardCallback(fenced, quarantine=True)
    for _ in range(3):
        callback.before_worker_group_start(context(2))
        callback.after_worker_group_start(group(A, B))
        callback.after_worker_group_poll_status(status({
            0: ValueError("bug"), 1: RuntimeError("Connection reset by peer")}))
    assert fenced.target.excluded_nodes() == []
    died = [e for e in fenced.target._log.path.read_text().splitlines() if "worker_died" in e]
    assert len(died) == 6 and A in died[0] and B in died[1]


def test_with_quarantine_off_nothing_is_counted_or_changed(fenced) -> None:
    callback = RayGuardCallback(fenced)
    for _ in range(2):
        callback.before_worker_group_start(context(1))
        callback.after_worker_group_start(group(A))
        callback.after_worker_group_poll_status(status({0: ActorDiedError()}))
    ctx = context(1)
    callback.before_worker_group_start(ctx)
    assert fenced.target.excluded_nodes() == [] and ctx.label_selector is None


def test_the_elastic_policy_counts_only_admitted_nodes(fenced) -> None:
    fenced.target.record_node_failures([NodeFailure(A, 0, "straggler")])
    sc = ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 1})
    policy = make_scaling_policy(sc, [1, 2, 3, 4], fence=FenceView(fenced))
    reserved = reserved_resources([{"CPU": 2.0}, {"CPU": 2.0}])
    assert policy._count_possible_workers(reserved) == 4  # keys are not A: both count


def test_the_elastic_policy_leaves_out_a_quarantined_nodes_reservation(fenced) -> None:
    if not isinstance(reserved_resources([{"CPU": 1.0}]), dict):
        pytest.skip("Ray 2.59 reserves without node ids: only the placement leaves a node out")
    fenced.target.record_node_failures([NodeFailure(A, 0, "straggler")])
    sc = ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 1})
    policy = make_scaling_policy(sc, [1, 2, 3, 4], fence=FenceView(fenced))
    by_node = {A: {"CPU": 2.0}, B: {"CPU": 1.0}}
    assert policy._count_possible_workers(by_node) == 1
    plain = make_scaling_policy(sc, [1, 2, 3, 4])
    assert plain._count_possible_workers(by_node) == 3
    shipped = make_scaling_policy(sc, [1, 2], fence=FenceView(None))  # an actor handle pickles
    assert isinstance(pickle.loads(pickle.dumps(shipped)).excluded, FenceView)


def test_a_fixed_run_that_no_longer_fits_waits_with_a_message(fenced, monkeypatch) -> None:
    monkeypatch.setattr(fence_module, "WAIT_POLL_S", 0.0)
    sc = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    policy = make_scaling_policy(sc, SimpleNamespace(global_batch_size=None, micro_batch_size=None),
                                 fence=FenceView(fenced, ttl_s=0), run_dir="/runs/r1")
    assert isinstance(policy, FencedFixedPolicy)
    policy._maybe_send_resource_request = lambda: None  # type: ignore[method-assign]
    assert isinstance(policy.make_decision_for_non_running_worker_group(), ResizeDecision)
    fenced.target.record_node_failures([])
    fenced.target.record_node_failures([NodeFailure(A, 0, "killed")])
    fenced.target.record_node_failures([NodeFailure(A, 1, "killed")])
    assert isinstance(policy.make_decision_for_non_running_worker_group(), NoopDecision)
    assert isinstance(policy.make_decision_for_non_running_worker_group(), NoopDecision)
    lines = fenced.target._log.path.read_text().splitlines()
    waits = [line for line in lines if '"placement_wait"' in line]
    assert len(waits) == 1  # one event per wait, however long it lasts
    assert "rayguard quarantine lift /runs/r1 NODE" in waits[0] and "room for 0" in waits[0]
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": A, "Alive": True, "Resources": {"CPU": 2.0}},
        {"NodeID": B, "Alive": True, "Resources": {"CPU": 2.0}}])
    decision = policy.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2


def test_the_wait_message_says_what_why_how_to_lift_and_that_it_waits() -> None:
    text = wait_message(4, 2, {A: {"reason": "oom", "failures": [{"attempt": 0}, {"attempt": 3}]}},
                        "/r")
    assert "4 worker(s) do not fit" in text and "room for 2" in text
    assert f"{A[:12]} (oom, attempts 0, 3)" in text and "Waiting for capacity" in text
    assert "rayguard quarantine lift /r NODE" in text
