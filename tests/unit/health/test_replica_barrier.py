"""After Ray's replacement of a replica group (``TorchftConfig``), survivors that reached the
report barrier after Ray's reset are released (rayguard.health.replica_barrier, its controller
side rayguard.controller.replica_barrier). The barrier read is proven against Ray's own
synchronization actor, run in this process; the whole scenario (rank 0 late to the report
where rank 1 was killed) in tests/ray/test_torchft.py."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

import pytest
from ray.train.v2._internal.execution.checkpoint.sync_actor import SynchronizationActor

import rayguard._ray.resize as ray_resize
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.controller.replica_barrier import ReplicaBarrier
from rayguard.events.kinds import KINDS, NOTABLE_KINDS
from rayguard.health.recovery import REPLICA_GROUP, RecoveryPath
from rayguard.health.replica_barrier import BarrierView, ReplicaBarrierWatch, StaleReport


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(**kw: Any) -> tuple[ReplicaBarrierWatch, Clock]:
    clock = Clock()
    return ReplicaBarrierWatch(after_s=5.0, every_s=0.5, clock=clock, **kw), clock


# -- the decision ------------------------------------------------------------------------------
def test_nothing_replaced_nothing_is_looked_at() -> None:
    w, _ = watch()
    assert not w.due()
    assert w.decide(BarrierView(frozenset({0}), 60.0)) is None


def test_survivors_alone_in_the_barrier_past_the_bound_are_released() -> None:
    w, clock = watch()
    w.replaced([1])
    assert w.due() and not w.due()  # at most every 0.5 s
    clock.now += 0.5
    assert w.due()
    assert w.decide(BarrierView(frozenset({0}), 4.9)) is None  # a peer only slow to arrive
    assert w.decide(BarrierView(frozenset(), 0.0)) is None  # nobody waits
    stale = w.decide(BarrierView(frozenset({0, 2}), 5.0))
    assert stale == StaleReport((0, 2), (1,), 5.0)
    assert stale.event_fields() == {"ranks": [0, 2], "replaced": [1], "waited_s": 5.0}
    assert "rank(s) [0, 2] released" in stale.message and "[1] will not join" in stale.message
    assert w.pending == {1}  # the replacement has still not reported: the watch goes on


def test_a_replaced_rank_seen_in_the_barrier_ends_its_watch_without_a_reset() -> None:
    w, _ = watch()
    w.replaced([1, 3])
    # the replacement of 1 waits with the survivors: their report is its report too
    assert w.decide(BarrierView(frozenset({0, 1}), 30.0)) is None
    assert w.pending == {3}
    w.settled([3])  # rank 3's replacement reported
    assert w.pending == frozenset() and not w.due()


def test_a_new_group_forgets_what_the_last_one_replaced() -> None:
    w, _ = watch()
    w.replaced([1])
    w.clear()
    assert w.pending == frozenset() and not w.due()


def test_the_event_kind_is_known_and_kept_off_the_console() -> None:
    assert "report_released" in KINDS and "report_released" not in NOTABLE_KINDS


# -- Ray's synchronization actor, read as the controller reads it --------------------------------
def test_the_barrier_read_names_the_waiting_rank_and_a_reset_releases_it() -> None:
    actor = SynchronizationActor.__ray_actor_class__()

    async def scenario() -> tuple[Any, Any]:
        # Ray 2.60 also takes the collective's sequence number (2.59 does not)
        accepts = inspect.signature(actor.broadcast_from_rank_zero).parameters
        extra = {"collective_seq": 1, "relaxable": True} if "collective_seq" in accepts else {}
        waiting = asyncio.ensure_future(actor.broadcast_from_rank_zero(
            world_rank=0, world_size=2, data="dir", caller_method_name="ray.train.report",
            **extra))
        await asyncio.sleep(0.05)
        seen = ray_resize._waiters(actor)
        await actor.reset()
        with pytest.raises(Exception, match="reset"):
            await waiting
        return seen, ray_resize._waiters(actor)

    seen, after = asyncio.run(scenario())
    assert seen[0] == [0] and 0.0 < seen[1] < 10.0
    assert after == ([], 0.0)


def test_ray_2_59s_actor_is_read_from_its_arrival_times_and_an_unknown_one_as_unknown() -> None:
    import time

    older = SimpleNamespace(_counter=1, _sync_start_times=[time.monotonic() - 6.0, None])
    ranks, waited = ray_resize._waiters(older)
    assert ranks == [0] and 6.0 <= waited < 16.0
    older._counter = 0  # released: the times of the last collective are not waiters
    assert ray_resize._waiters(older) == ([], 0.0)
    assert ray_resize._waiters(SimpleNamespace()) is None


# -- the controller's side ------------------------------------------------------------------------
class Coordinator:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.record = SimpleNamespace(remote=self.events.append)


def status(running: bool = True, report: Any = None) -> Any:
    return SimpleNamespace(running=running, training_report=report, error=None)


@pytest.fixture
def barrier(monkeypatch: pytest.MonkeyPatch) -> tuple[ReplicaBarrier, list[Any], Clock]:
    calls: list[Any] = []

    def read(group: Any) -> Any:
        calls.append("read")
        return [0], 6.0

    monkeypatch.setattr(ray_resize, "barrier_waiters", read)
    monkeypatch.setattr(ray_resize, "reset_barrier", lambda group: calls.append("reset"))
    w, clock = watch()
    b = ReplicaBarrier(Coordinator(), w)
    b.started(object())
    return b, calls, clock


def test_survivors_late_to_rays_reset_are_released_and_the_release_is_recorded(barrier) -> None:
    b, calls, clock = barrier
    b.poll({0: status(), 1: status()}, attempt=0)
    assert calls == []  # nothing replaced: the barrier is not read at all
    b.replaced([1])
    b.poll({0: status(), 1: status()}, attempt=0)
    assert calls == ["read", "reset"]
    (event,) = b.coordinator.events
    assert event["kind"] == "report_released" and event["attempt"] == 0
    assert (event["ranks"], event["replaced"], event["waited_s"]) == ([0], [1], 6.0)
    b.poll({0: status(), 1: status()}, attempt=0)
    assert calls == ["read", "reset"]  # not again within 0.5 s
    clock.now += 0.5
    b.poll({0: status(), 1: status(report=object())}, attempt=0)  # the replacement reported
    assert calls == ["read", "reset"] and b.watch.pending == frozenset()


def test_an_unreadable_or_unknown_barrier_leaves_rays_behaviour(barrier, monkeypatch) -> None:
    b, calls, clock = barrier

    def gone(group: Any) -> Any:
        raise RuntimeError("actor died")

    b.replaced([1])
    monkeypatch.setattr(ray_resize, "barrier_waiters", gone)
    b.poll({0: status(), 1: status()}, attempt=0)
    assert b.watch.pending == {1} and b.coordinator.events == []
    monkeypatch.setattr(ray_resize, "barrier_waiters", lambda group: None)
    clock.now += 0.5
    b.poll({0: status(), 1: status()}, attempt=0)
    assert b.watch.pending == frozenset() and b.coordinator.events == []


def test_the_callback_watches_after_a_replica_group_replacement_only() -> None:
    coordinator = Coordinator()
    callback = RayGuardCallback(coordinator, mode=REPLICA_GROUP)
    callback._plan = RecoveryPath(REPLICA_GROUP, (1,), "rank(s) [1] replaced", attempt=0)
    callback.before_controller_execute_failure_decision(SimpleNamespace(value="RETRY"))
    assert callback.replica_barrier.watch.pending == {1}
    assert [e["path"] for e in coordinator.events if e["kind"] == "restart"] == ["replica_group"]
