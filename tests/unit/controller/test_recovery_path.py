"""The controller callback applying the recovery path (rayguard/health/recovery.py, its
table in tests/unit/health/test_recovery.py) on Ray's own poll-status objects with the run's
real coordinator in process: a killed rank replaced alone, and a live recovery that fails
falling back to one whole-group restart, never to another replacement alone (measured at 16
ranks: rank 11 killed, then ranks [10, 12] and [11] "replaced alone" again)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray
from ray.exceptions import ActorDiedError
from ray.train import FailureConfig
from ray.train.v2._internal.constants import DEFAULT_WORKER_GROUP_START_TIMEOUT_S
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus
from ray.train.v2.api.exceptions import WorkerGroupError

from rayguard._ray.train import FailureDecision, fail_every_worker, marked_failed
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.controller.failure_policy import GuardFailurePolicy
from rayguard.exceptions import PeersLostError
from rayguard.health.live import live_key
from rayguard.health.recovery import LIVE

WORLD = 16


# -- the callback applying it --------------------------------------------------------------
def poll(errors: dict[int, BaseException], world: int = WORLD) -> WorkerGroupPollStatus:
    """A poll of a live group: every worker its own replica group, as Ray sees it."""
    return WorkerGroupPollStatus(
        worker_statuses={r: WorkerStatus(running=r not in errors, error=errors.get(r))  # type: ignore[arg-type]
                         for r in range(world)},
        worker_rank_to_replica_group_rank={r: r for r in range(world)})


def replaced_alone_by_ray(status: WorkerGroupPollStatus) -> bool:
    """Ray 2.60's own test in ``_execute_resize_decision`` (with replica groups)."""
    failing = status.failing_replica_group_indices
    return bool(failing) and failing != status.all_replica_group_indices


@pytest.fixture
def live(coordinator, monkeypatch) -> RayGuardCallback:
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": f"node{i}", "Alive": True, "Resources": {"CPU": 4.0}} for i in range(4)])
    callback = RayGuardCallback(coordinator, mode=LIVE)
    callback.before_worker_group_start(None)
    workers = [SimpleNamespace(metadata=SimpleNamespace(node_id=f"node{r // 4}"))
               for r in range(WORLD)]
    callback.after_worker_group_start(SimpleNamespace(get_workers=lambda: workers))
    return callback


def restarts(events) -> list[dict]:
    return [e for e in events() if e["kind"] == "restart"]


def kill_rank_11(live: RayGuardCallback) -> None:
    status = poll({11: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)


def test_a_killed_rank_is_replaced_alone(live, coordinator, events) -> None:
    kill_rank_11(live)
    (restart,) = restarts(events)
    assert restart["path"] == "live" and restart["ranks"] == [11] and restart["next_attempt"] == 1
    notice = coordinator.target.get(live_key(0))
    assert notice["ranks"] == [11]
    # the survivors wait for the replacement's process start (Ray Train's start timeout,
    # its default here: the group does not say) and its set-up (live_wait_s)
    assert notice["setup_within_s"] == 30.0 + DEFAULT_WORKER_GROUP_START_TIMEOUT_S


def test_survivors_failing_in_the_live_attempt_restart_the_whole_group_once(
        live, coordinator, events) -> None:
    kill_rank_11(live)
    status = poll({10: PeersLostError("rank 10: no word from rank 0"),
                   12: PeersLostError("rank 12: no word from rank 0")})
    live.after_worker_group_poll_status(status)
    assert not replaced_alone_by_ray(status)  # every worker marked: Ray restarts the group
    assert sorted(status.errors) == list(range(WORLD))
    assert [r for r, e in status.errors.items() if not marked_failed(e)] == [10, 12]
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    fallback = restarts(events)[-1]
    assert "path" not in fallback and fallback["attempt"] == 1
    assert "survivor(s) [10, 12] failed in it" in fallback["fallback"]
    assert fallback["fallback"] in fallback["detail"]
    assert coordinator.target.get(live_key(1)) is None  # no second live round was opened
    assert [e["rank"] for e in events() if e["kind"] == "worker_died"] == [11, 10, 12]
    # Ray's whole-group start: a fresh attempt, whose own loss is replaced alone again
    live.before_worker_group_start(None)
    assert live._attempt == 2
    status = poll({5: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert restarts(events)[-1]["path"] == "live" and restarts(events)[-1]["ranks"] == [5]


def test_a_replacement_that_fails_in_its_live_attempt_restarts_the_whole_group(
        live, events) -> None:
    kill_rank_11(live)
    status = poll({11: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert not replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert "replacement(s) [11] failed in it" in restarts(events)[-1]["fallback"]


def test_a_live_attempt_that_committed_is_settled_and_recovers_live_again(
        live, coordinator, events) -> None:
    coordinator.target.record({"kind": "checkpoint_committed", "step": 4, "path": "/r/c4",
                               "detail": "x"})
    kill_rank_11(live)
    coordinator.target.record({"kind": "checkpoint_committed", "step": 9, "path": "/r/c9",
                               "detail": "x"})
    status = poll({3: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert [(e.get("path"), e.get("ranks")) for e in restarts(events)] == [
        ("live", [11]), ("live", [3])]


def test_a_lost_node_still_falls_back(live, events, monkeypatch) -> None:
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": "node0", "Alive": True, "Resources": {}},
        {"NodeID": "node1", "Alive": True, "Resources": {}},
        {"NodeID": "node2", "Alive": False, "Resources": {}}])
    status = poll({9: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert not replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert "node(s) node2 of rank(s) [9] lost" in restarts(events)[-1]["fallback"]


def test_a_retry_without_a_failed_poll_is_a_plain_restart(live, events) -> None:
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)  # a scheduling error
    assert [("path" in e, "fallback" in e) for e in restarts(events)] == [(False, False)]


def test_the_failure_policy_counts_only_the_workers_own_failures(coordinator) -> None:
    # the replacement raises again in its live attempt: the crash loop is still seen, though
    # every other worker was marked failed to restart the group
    policy = GuardFailurePolicy(FailureConfig(max_failures=10), coordinator, crash_loop_retries=1)
    decisions = []
    for _ in range(2):
        coordinator.target.open_attempt("restart")
        coordinator.target.record_failure(1, coordinator.target.attempt(), "builtins.ValueError",
                                          "train.py:3 in loop", step=-1,
                                          summary="ValueError: my bug")
        status = poll({1: ValueError("my bug")}, world=4)
        fail_every_worker(status, PeersLostError("restart the group"))
        decisions.append(policy.make_decision(WorkerGroupError("failed", status.errors)))
    assert decisions == [FailureDecision.RETRY, FailureDecision.RAISE]


def raised(coordinator, rank: int, attempt: int = 0) -> None:
    """``rank``'s function raised in ``attempt``: it records its failure before its error
    leaves the worker (Ray's poll may show the error only later)."""
    coordinator.target.record_failure(rank, attempt, "builtins.ValueError", "loop.py:3", 0,
                                      "ValueError: my bug")


def test_a_bug_every_rank_hits_seen_one_rank_per_poll_restarts_the_group(
        live, coordinator, events) -> None:
    # measured under live recovery: rank 1's error was seen first, rank 1 was replaced
    # alone, rank 0's own error came in the live attempt and made it a "failed live recovery"
    for rank in range(WORLD):
        raised(coordinator, rank)
    status = poll({1: ValueError("my bug")})
    live.after_worker_group_poll_status(status)
    assert sorted(status.errors) == list(range(WORLD)) and not replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    (restart,) = restarts(events)
    assert "path" not in restart and "every rank failed" in restart["fallback"]
    died = [e for e in events() if e["kind"] == "worker_died"]
    assert sorted(e["rank"] for e in died) == list(range(WORLD))
    assert all("my bug" in e["detail"] and "my bug" in e["details"] for e in died)
    assert all(e["failure"] == "error" and e["error_type"].endswith("ValueError") for e in died)


def test_ranks_that_raised_before_the_poll_saw_them_are_replaced_with_the_others(
        live, coordinator, events) -> None:
    raised(coordinator, 3)
    raised(coordinator, 9)
    raised(coordinator, 5, attempt=1)  # of another attempt: not this failure's
    status = poll({3: ValueError("my bug")})
    live.after_worker_group_poll_status(status)
    assert sorted(status.errors) == [3, 9] and replaced_alone_by_ray(status)
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    (restart,) = restarts(events)
    assert restart["path"] == "live" and restart["ranks"] == [3, 9]


def test_under_live_recovery_a_raise_waits_a_moment_for_its_peers(
        live, coordinator, events, monkeypatch) -> None:
    # a checkpoint no rank can load: rank 1's raise is polled first, rank 7's record comes
    # while the controller waits (RAISE_GRACE_S), and both are planned for together
    import rayguard.controller.callbacks as callbacks

    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            raised(coordinator, 7)

    monkeypatch.setattr(callbacks.time, "sleep", sleep)
    raised(coordinator, 1)
    status = poll({1: ValueError("unknown checkpoint format")})
    live.after_worker_group_poll_status(status)
    assert sorted(status.errors) == [1, 7] and slept
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert restarts(events)[-1]["ranks"] == [1, 7]


def test_a_death_is_planned_at_once(live, coordinator, monkeypatch) -> None:
    import rayguard.controller.callbacks as callbacks

    monkeypatch.setattr(callbacks.time, "sleep", lambda s: pytest.fail("waited on a death"))
    status = poll({4: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert sorted(status.errors) == [4]


def test_a_replacement_that_finds_a_second_worker_dead_restarts_the_group(coordinator) -> None:
    # measured on a node whose workers were all killed: rank 1's death was polled first, and
    # Ray's replacement of rank 1 alone met rank 0 dead too (ControllerError: RayActorError),
    # which Ray's own policy does not retry: the run ended
    from ray.train import ControllerError

    policy = GuardFailurePolicy(FailureConfig(max_failures=2), coordinator)
    error = ControllerError(ActorDiedError())
    assert [policy.make_decision(error) for _ in range(3)] == [
        FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]  # the budget
    other = ControllerError(RuntimeError("a bug in a callback"))
    assert GuardFailurePolicy(FailureConfig(max_failures=2), coordinator).make_decision(
        other) == FailureDecision.RAISE


# -- an elastic run under live recovery: a lost node's shrink is a resize ---------------------
@pytest.fixture
def elastic(coordinator, monkeypatch) -> RayGuardCallback:
    """Live recovery on an elastic run: 16 ranks, 4 a node."""
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": f"node{i}", "Alive": True, "Resources": {"CPU": 4.0}} for i in range(4)])
    callback = RayGuardCallback(coordinator, mode=LIVE, elastic=True)
    callback.before_worker_group_start(None)
    workers = [SimpleNamespace(metadata=SimpleNamespace(node_id=f"node{r // 4}"))
               for r in range(WORLD)]
    callback.after_worker_group_start(SimpleNamespace(get_workers=lambda: workers))
    return callback


def lose_node2(monkeypatch) -> None:
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": f"node{i}", "Alive": i != 2, "Resources": {}} for i in range(4)])


def test_an_elastic_live_run_plans_a_lost_nodes_shrink_as_a_resize(
        elastic, coordinator, events, monkeypatch) -> None:
    assert elastic.resizer is not None
    lose_node2(monkeypatch)
    status = poll({8: ActorDiedError(), 9: ActorDiedError()})
    elastic.after_worker_group_poll_status(status)
    # the survivors are not failed: the elastic policy's size change comes next
    assert sorted(status.errors) == [8, 9]
    elastic.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert elastic._shrink == frozenset({8, 9})
    assert restarts(events) == []  # the resize records its own event
    assert coordinator.target.attempt() == 0 and coordinator.target.get(live_key(0)) is None
    group = SimpleNamespace(get_workers=lambda: list(range(WORLD)))
    assert elastic.wants_resize(group, 14)
    assert elastic.wants_resize(group, WORLD)  # the shrink is pending, whatever the size


def test_a_fixed_size_live_run_still_restarts_for_a_lost_node(
        live, coordinator, events, monkeypatch) -> None:
    assert live.resizer is None
    lose_node2(monkeypatch)
    status = poll({9: ActorDiedError()})
    live.after_worker_group_poll_status(status)
    assert sorted(status.errors) == list(range(WORLD))  # every worker failed: a restart
    live.before_controller_execute_failure_decision(FailureDecision.RETRY)
    (restart,) = restarts(events)
    assert "path" not in restart and "node(s) node2 of rank(s) [9] lost" in restart["fallback"]
    assert live._shrink is None


def test_elastic_without_live_recovery_has_no_resizer(coordinator) -> None:
    assert RayGuardCallback(coordinator, elastic=True).resizer is None
    assert RayGuardCallback(coordinator, mode="replica_group", elastic=True).resizer is None
    assert RayGuardCallback(coordinator, mode=LIVE, elastic=False).resizer is None
    resizer = RayGuardCallback(coordinator, mode=LIVE, elastic=True, live_wait_s=7.5).resizer
    assert resizer is not None and resizer.wait_s == 7.5 and resizer.coordinator is coordinator


def test_a_lost_node_in_an_unsettled_live_attempt_restarts_the_elastic_group(
        elastic, coordinator, events, monkeypatch) -> None:
    kill_rank_11(elastic)  # rank 11 replaced alone: live attempt 1, not yet committed
    assert restarts(events)[-1]["path"] == "live"
    lose_node2(monkeypatch)
    status = poll({9: ActorDiedError()})
    elastic.after_worker_group_poll_status(status)
    assert sorted(status.errors) == list(range(WORLD))
    elastic.before_controller_execute_failure_decision(FailureDecision.RETRY)
    fallback = restarts(events)[-1]
    assert "path" not in fallback and fallback["attempt"] == 1
    assert "live attempt 1 (rank(s) [11] replaced) failed" in fallback["fallback"]
    assert elastic._shrink is None
