"""Resizing an elastic group in place, in the controller (rayguard/controller/resize.py): the
protocol's order against a small fake coordinator and fake Ray pieces (open the attempt, wait
for the kept ranks to leave, clear, shrink or grow, publish the go fact, start new workers),
its fallbacks to Ray's restart, and the callback's part (RayGuardCallback.wants_resize and
resize_in_place)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray

import rayguard._ray.resize as ray_resize
import rayguard.controller.resize as resize_mod
from rayguard._ray.train import FailureDecision
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.controller.resize import InPlaceResizer, go_key, left_key
from rayguard.health.recovery import LIVE, RESIZE, RESTART, LiveAttempt, plan_recovery_path
from rayguard.run.attempts import Attempt, Attempts


class _Remote:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class FakeCoordinator:
    """The run coordinator's methods the resizer calls, each ``.remote(...)`` answering at
    once (``ray.get`` is the identity in these tests). ``leave``: old rank -> after how many
    ``present`` questions its left mark appears (absent: never)."""

    def __init__(self, calls: list[str], leave: dict[int, int] | None = None,
                 attempt: int = 0) -> None:
        self.calls = calls
        self.leave = leave or {}
        self.attempts = Attempts()
        for _ in range(attempt + 1):
            self.attempts.open(RESTART)
        self.opened: list[tuple] = []
        self.facts: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []
        self.asked = 0
        self.open_attempt = _Remote(self._open_attempt)
        self.present = _Remote(self._present)
        self.put = _Remote(self._put)
        self.record = _Remote(self.events.append)
        self.get = _Remote(self.facts.get)

    def _open_attempt(self, kind: Any, failed: int | None = None,
                      replaced: list[int] | None = None, detail: str = "",
                      resize: dict[str, Any] | None = None,
                      within_s: float | None = None) -> Attempt:
        self.calls.append("open_attempt")
        self.opened.append((kind, failed, replaced, detail, resize, within_s))
        return self.attempts.open(kind, replaced=replaced or ())

    def _present(self, keys: list[str]) -> list[str]:
        self.calls.append("present")
        self.asked += 1
        left = self.opened[-1][1]  # the attempt the kept ranks leave
        for rank, after in self.leave.items():
            if self.asked > after:
                self.facts.setdefault(left_key(left, rank), True)
        return [k for k in keys if self.facts.get(k) is not None]

    def _put(self, key: str, value: Any) -> None:
        self.calls.append(f"put {key}")
        self.facts[key] = value


class FakeGroup:
    """A worker group whose workers are plain objects (``old`` rank, ``place`` once placed)
    and whose placement group has the bundles ``free`` that no worker holds."""

    def __init__(self, world: int, free: tuple[int, ...] = ()) -> None:
        self.workers = [SimpleNamespace(old=r, place=None) for r in range(world)]
        self.free = list(free)

    def get_workers(self) -> list[Any]:
        return self.workers


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The Ray pieces of rayguard._ray.resize replaced by recorders; ``calls``: what ran, in
    order (the coordinator's fake appends to it too)."""
    made: list[str] = []
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    monkeypatch.setattr(resize_mod, "BARRIER_RESET_EVERY_S", 0.01)

    def place_all(group: FakeGroup) -> None:
        for i, worker in enumerate(group.workers):
            worker.place = {"world_rank": i, "world_size": len(group.workers)}

    def shrink_group(group: FakeGroup, keep) -> None:
        made.append(f"shrink_group {list(keep)}")
        group.workers = [group.workers[r] for r in keep]
        place_all(group)

    def grow_group(group: FakeGroup, bundles, wait_s: float, phases=None) -> list[Any]:
        made.append(f"grow_group {list(bundles)} {wait_s}")
        phases.update(placed_s=0.0, workers_s=0.0)
        new = [SimpleNamespace(old=None, place=None, bundle=b) for b in bundles]
        group.workers = group.workers + new
        place_all(group)
        return new

    monkeypatch.setattr(ray_resize, "free_bundles", lambda group: list(group.free))
    monkeypatch.setattr(ray_resize, "survivors_cleared",
                        lambda group, ranks: made.append(f"survivors_cleared {list(ranks)}"))
    monkeypatch.setattr(ray_resize, "shrink_group", shrink_group)
    monkeypatch.setattr(ray_resize, "grow_group", grow_group)
    monkeypatch.setattr(ray_resize, "start_new", lambda group, new: made.append(
        f"start_new {[w.bundle for w in new]}"))
    monkeypatch.setattr(ray_resize, "place_fields", lambda worker: dict(worker.place))
    monkeypatch.setattr(ray_resize, "reset_barrier",
                        lambda group: made.append("reset_barrier"))
    return made


def protocol(calls: list[str]) -> list[str]:
    """The calls without the waits (the ``present`` questions and barrier resets)."""
    return [c for c in calls if c not in ("present", "reset_barrier")]


def test_a_shrink_in_place_follows_the_protocol(calls) -> None:
    coordinator = FakeCoordinator(calls, leave={0: 2, 2: 1, 3: 3})
    group = FakeGroup(4)
    placed: list[int] = []

    def on_placed(wg: FakeGroup) -> None:
        calls.append("on_placed")
        placed.append(len(wg.workers))

    opened = InPlaceResizer(coordinator, wait_s=5.0).resize(
        group, 3, attempt=0, failed=frozenset({1}), on_placed=on_placed)
    assert opened == coordinator.attempts.latest and opened is not None
    assert (opened.number, opened.kind, opened.replaced) == (1, RESIZE, (1,))
    assert protocol(calls) == ["open_attempt", "survivors_cleared [0, 2, 3]",
                               "shrink_group [0, 2, 3]", "on_placed", "put resize:go:1"]
    # it waited until every kept rank had left: three questions, the last one all there
    assert calls.count("present") == 4
    assert calls.index("survivors_cleared [0, 2, 3]") > max(
        i for i, c in enumerate(calls) if c == "present")
    assert placed == [3]
    kind, failed, replaced, detail, notice, within_s = coordinator.opened[0]
    assert (kind, failed, replaced) == (RESIZE, 0, [1])
    # a kept rank waits for the go fact as long as the controller's own bounds: the leave
    # and the shrink (live_wait_s each)
    assert notice == {"old_world_size": 4, "world_size": 3, "direction": "shrink",
                      "go_within_s": 10.0}
    assert within_s is None  # no new worker to wait for at set-up: live_wait_s
    assert "from 4 to 3" in detail and "[0, 2, 3] keep their processes" in detail
    assert coordinator.facts[go_key(1)] == {"places": {
        "0": {"world_rank": 0, "world_size": 3}, "2": {"world_rank": 1, "world_size": 3},
        "3": {"world_rank": 2, "world_size": 3}}}
    (event,) = coordinator.events
    assert event["kind"] == "resize" and event["path"] == "live"
    assert event["attempt"] == 0 and event["next_attempt"] == 1
    assert event["rank_map"] == {"0": 0, "1": None, "2": 1, "3": 2}
    assert event["lost_ranks"] == [1] and "fallback" not in event
    assert set(event["phases"]) == {"leave_s", "controller_s"}


def test_a_shrink_past_the_survivors_drops_the_retired_ranks_too(calls) -> None:
    coordinator = FakeCoordinator(calls, leave={0: 0, 1: 0})
    opened = InPlaceResizer(coordinator, wait_s=5.0).resize(
        FakeGroup(4), 2, attempt=0, failed=frozenset({2}))
    assert opened is not None and opened.replaced == (2, 3)
    assert "shrink_group [0, 1]" in calls
    assert coordinator.events[0]["retired_ranks"] == [3]


def test_a_grow_starts_the_new_workers_after_the_go_fact(calls) -> None:
    coordinator = FakeCoordinator(calls, leave={0: 0, 1: 0}, attempt=3)
    group = FakeGroup(2, free=(5, 2))
    group._worker_group_start_timeout_s = 45.0  # Ray Train's worker-group start timeout
    opened = InPlaceResizer(coordinator, wait_s=4.0).resize(
        group, 3, attempt=3, on_placed=lambda wg: calls.append("on_placed"))
    assert opened is not None and (opened.number, opened.replaced) == (4, ())
    assert protocol(calls) == ["open_attempt", "survivors_cleared [0, 1]",
                               "grow_group [2] 4.0", "on_placed", "put resize:go:4",
                               "start_new [2]"]
    assert not any(c.startswith("shrink_group") for c in calls)
    assert coordinator.opened[0][1:3] == (3, [])
    # a grow's event says how long the new bundles took to be placed and the actors to start
    assert set(coordinator.events[0]["phases"]) == {"leave_s", "placed_s", "workers_s",
                                                    "controller_s"}
    assert coordinator.opened[0][4]["direction"] == "grow"
    # kept ranks wait for the leave, the placement and the new processes' start
    assert coordinator.opened[0][4]["go_within_s"] == 4.0 + 4.0 + 45.0
    # and then, at set-up, for the new workers' own (as for a live replacement)
    assert coordinator.opened[0][5] == 4.0 + 45.0
    assert coordinator.facts[go_key(4)] == {"places": {
        "0": {"world_rank": 0, "world_size": 3}, "1": {"world_rank": 1, "world_size": 3}}}
    (event,) = coordinator.events
    assert event["path"] == "live" and event["direction"] == "grow" and event["added"] == 1
    assert "1 new worker(s)" in event["detail"]


def test_a_group_that_does_not_say_its_start_timeout_gets_rays_default() -> None:
    from ray.train.v2._internal.constants import DEFAULT_WORKER_GROUP_START_TIMEOUT_S

    assert ray_resize.worker_start_s(SimpleNamespace()) == DEFAULT_WORKER_GROUP_START_TIMEOUT_S
    assert ray_resize.worker_start_s(SimpleNamespace(_worker_group_start_timeout_s=0)) == \
        DEFAULT_WORKER_GROUP_START_TIMEOUT_S
    assert ray_resize.worker_start_s(SimpleNamespace(_worker_group_start_timeout_s=90)) == 90.0


def test_kept_ranks_that_never_leave_fall_back_to_a_restart(calls) -> None:
    coordinator = FakeCoordinator(calls, leave={0: 0})  # ranks 2 and 3 never leave
    group = FakeGroup(4)
    before = list(group.workers)
    opened = InPlaceResizer(coordinator, wait_s=0.2).resize(
        group, 3, attempt=0, failed=frozenset({1}),
        on_placed=lambda wg: pytest.fail("placed on a fallback"))
    assert opened is None
    assert protocol(calls) == ["open_attempt"]  # nothing cleared, shrunk, put or started
    assert "reset_barrier" in calls  # the barrier was reset while it waited
    assert group.workers == before
    assert go_key(1) not in coordinator.facts
    (event,) = coordinator.events
    assert event["kind"] == "resize" and event["path"] == "restart"
    assert "did not leave attempt 0 within 0.2 s" in event["fallback"]
    assert event["attempt"] == 0 and event["next_attempt"] == 1
    assert event["lost_ranks"] == [1] and "phases" not in event


def test_a_barrier_that_cannot_be_reset_does_not_stop_the_wait(calls, monkeypatch) -> None:
    def broken(group: Any) -> None:
        calls.append("reset_barrier")
        raise RuntimeError("sync actor gone")

    monkeypatch.setattr(ray_resize, "reset_barrier", broken)
    coordinator = FakeCoordinator(calls, leave={0: 3, 1: 3})
    opened = InPlaceResizer(coordinator, wait_s=5.0).resize(
        FakeGroup(3), 2, attempt=0, failed=frozenset({2}))
    assert opened is not None and "reset_barrier" in calls
    assert "shrink_group [0, 1]" in calls


@pytest.mark.parametrize("old, new, failed, why", [
    (4, 4, frozenset({1}), "the elastic policy kept 4 workers: not a resize"),
    (2, 4, frozenset(), "needs 2 free placement-group bundle(s), the group has 0"),
    (4, 3, frozenset({0, 1}), "2 survivor(s) cannot fill 3 ranks"),
])
def test_a_plan_not_in_place_opens_nothing_and_records_why(calls, old, new, failed,
                                                            why) -> None:
    coordinator = FakeCoordinator(calls, leave=dict.fromkeys(range(old), 0))
    opened = InPlaceResizer(coordinator).resize(FakeGroup(old), new, attempt=0, failed=failed)
    assert opened is None
    assert protocol(calls) == [] and "present" not in calls
    assert coordinator.opened == [] and coordinator.attempts.current == 0
    (event,) = coordinator.events
    assert event["path"] == "restart" and why in event["fallback"]
    assert event["attempt"] == 0 and "next_attempt" not in event


# -- the callback's part ---------------------------------------------------------------------
class NoRemote:
    """A coordinator the callback must not call."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"coordinator.{name} called")


def group_of(world: int) -> SimpleNamespace:
    workers = [SimpleNamespace(metadata=SimpleNamespace(node_id=f"n{r // 2}"))
               for r in range(world)]
    return SimpleNamespace(get_workers=lambda: workers)


def pend_shrink(callback: RayGuardCallback, ranks: set[int]) -> None:
    """A poll planned a lost node's resize and the failure decision was RETRY."""
    callback._plan = plan_recovery_path(ranks, 4, mode=LIVE, attempt=0, lost_nodes=["n1"],
                                        elastic=True)
    callback.before_controller_execute_failure_decision(FailureDecision.RETRY)


def test_without_a_resizer_no_size_change_is_the_callbacks() -> None:
    callback = RayGuardCallback(NoRemote(), mode=LIVE)
    assert callback.resizer is None
    assert not callback.wants_resize(group_of(4), 2)
    assert not callback.wants_resize(group_of(4), 4)


def test_the_same_size_with_no_pending_shrink_is_rays() -> None:
    callback = RayGuardCallback(NoRemote(), mode=LIVE, elastic=True)
    assert not callback.wants_resize(group_of(4), 4)


def test_another_size_is_the_callbacks() -> None:
    callback = RayGuardCallback(NoRemote(), mode=LIVE, elastic=True)
    assert callback.wants_resize(group_of(4), 3)
    assert callback.wants_resize(group_of(4), 6)


def test_a_pending_shrink_is_the_callbacks_whatever_the_size() -> None:
    callback = RayGuardCallback(NoRemote(), mode=LIVE, elastic=True)
    pend_shrink(callback, {2, 3})
    assert callback._shrink == frozenset({2, 3})
    assert callback.wants_resize(group_of(4), 4)


def test_a_planned_restart_is_never_made_in_place_whatever_its_size() -> None:
    """A resized attempt that failed before its first commit restarts the whole group (plan
    row 4): Ray's restart, at the size the elastic policy chooses (here smaller: the grow's
    new node is gone), is Ray's, once; the size changes after it are the callback's again."""
    recorded: list[dict] = []
    callback = RayGuardCallback(SimpleNamespace(record=_Remote(recorded.append)), mode=LIVE,
                                elastic=True)
    callback._plan = plan_recovery_path(
        {2}, 3, mode=LIVE, attempt=2, lost_nodes=["n1"], elastic=True,
        live_attempt=LiveAttempt(2, (), resized=(2, 3)))
    callback.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert [e["kind"] for e in recorded] == ["restart"] and "fallback" in recorded[0]
    assert not callback.wants_resize(group_of(3), 2)  # the restart: Ray's
    assert callback.wants_resize(group_of(2), 3)  # a later grow: in place again


class FakeResizer:
    def __init__(self, answer: Attempt | None) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    def resize(self, worker_group: Any, new_world: int, **kwargs: Any) -> Attempt | None:
        self.asked.append({"group": worker_group, "new_world": new_world, **kwargs})
        return self.answer


def test_resize_in_place_hands_the_shrink_to_the_resizer_and_runs_its_attempt(
        monkeypatch) -> None:
    callback = RayGuardCallback(NoRemote(), mode=LIVE, elastic=True)
    monkeypatch.setattr(callback, "_committed", lambda: "ckpt-4")
    callback._attempt = 0
    pend_shrink(callback, {2, 3})
    opened = Attempt(1, RESIZE, (2, 3), 1.0)
    callback.resizer = FakeResizer(opened)  # type: ignore[assignment]
    group = group_of(2)
    placed = lambda wg: None  # noqa: E731
    assert callback.resize_in_place(group, 2, placed)
    (asked,) = callback.resizer.asked  # type: ignore[union-attr]
    assert asked == {"group": group, "new_world": 2, "attempt": 0,
                     "failed": frozenset({2, 3}), "on_placed": placed}
    assert callback._attempt == 1 and callback._live == (opened, "ckpt-4", (2, 2))
    assert callback._nodes == ["n0", "n0"]
    assert callback._shrink is None  # used once
    assert not callback.wants_resize(group, 2)
    # a failure before the resized attempt's first commit: its fallback names the resize
    live = callback._live_attempt()
    assert live is not None and live.resized == (len(group.get_workers()), 2)
    assert not live.settled
    plan = plan_recovery_path({1}, 2, mode=LIVE, attempt=1, live_attempt=live,
                              lost_nodes=["n"], elastic=True)
    assert plan.kind == RESTART and "resized in place from" in (plan.fallback or "")


def test_a_resize_that_falls_back_keeps_the_callbacks_attempt(monkeypatch) -> None:
    callback = RayGuardCallback(NoRemote(), mode=LIVE, elastic=True)
    monkeypatch.setattr(callback, "_committed", lambda: None)
    callback._attempt = 5
    callback.resizer = FakeResizer(None)  # type: ignore[assignment]
    assert not callback.resize_in_place(group_of(4), 6)
    (asked,) = callback.resizer.asked  # type: ignore[union-attr]
    assert asked["failed"] == frozenset() and asked["attempt"] == 5
    assert callback._attempt == 5 and callback._live is None and callback._shrink is None
