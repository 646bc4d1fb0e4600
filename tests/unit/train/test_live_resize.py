"""A worker's side of a resize in place (rayguard/train/live.py): the report-time watch that
leaves the attempt once the run's notice says "resize", taking the new place from the
controller's go fact, and writing that place into Ray's train context and the torch
variables. Fake links, no Ray process."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

import rayguard.train.live as live
from rayguard.controller.resize import go_key, left_key
from rayguard.exceptions import PeersLostError
from rayguard.health.live import live_key, looks_like_peer_loss

RESIZE_NOTICE = {"attempt": 3, "ranks": [1], "at": 1.0, "detail": "resized",
                 "resize": {"old_world_size": 4, "world_size": 3, "direction": "shrink"}}
LIVE_NOTICE = {"attempt": 3, "ranks": [1], "at": 1.0, "detail": "rank 1 replaced"}
PLACE = {"world_rank": 1, "world_size": 3, "local_rank": 0, "local_world_size": 2,
         "node_rank": 1}


class FakePoll:
    def __init__(self, value: Any = None) -> None:
        self.current = value

    def value(self) -> Any:
        return self.current


class FakeLink:
    """What the worker parts call on a RunLink: ``ctx``, ``fact_poll``, ``get``, ``mark``,
    ``wait_fact`` over a dict of facts."""

    def __init__(self, rank: int = 2, attempt: int = 2, facts: dict[str, Any] | None = None
                 ) -> None:
        self.ctx = SimpleNamespace(rank=rank, attempt=attempt)
        self.facts = dict(facts or {})
        self.polls: dict[str, FakePoll] = {}
        self.marked: list[tuple[str, Any]] = []
        self.waited: list[tuple[str, float]] = []

    def fact_poll(self, key: str) -> FakePoll:
        return self.polls.setdefault(key, FakePoll())

    def get(self, key: str) -> Any:
        return self.facts.get(key)

    def mark(self, key: str, value: Any) -> None:
        self.marked.append((key, value))
        self.facts[key] = value

    def wait_fact(self, key: str, timeout_s: float) -> Any:
        self.waited.append((key, timeout_s))
        return self.facts.get(key)


# -- ResizeWatch -----------------------------------------------------------------------------
def test_the_watch_is_quiet_until_a_notice_comes() -> None:
    link = FakeLink()
    watch = live.ResizeWatch(link)
    assert list(link.polls) == [live_key(2)]  # it watches this attempt's notice
    watch()
    watch()


def test_the_watch_lets_a_live_notice_pass() -> None:
    link = FakeLink()
    watch = live.ResizeWatch(link)
    link.polls[live_key(2)].current = LIVE_NOTICE  # a peer replaced alone: not the watch's
    watch()


def test_the_watch_leaves_the_attempt_at_a_resize_notice() -> None:
    link = FakeLink(rank=2, attempt=2)
    watch = live.ResizeWatch(link)
    link.polls[live_key(2)].current = RESIZE_NOTICE
    with pytest.raises(PeersLostError) as raised:
        watch()
    message = str(raised.value)
    assert message == "rank 2: attempt 2 is resized in place from 4 to 3 worker(s)"
    # the error reads as a peer's loss, so the rank waits for the notice instead of raising
    assert looks_like_peer_loss(type(raised.value).__name__, message)


# -- take_place ------------------------------------------------------------------------------
@pytest.fixture
def applied(monkeypatch) -> list[dict[str, int]]:
    made: list[dict[str, int]] = []
    monkeypatch.setattr(live, "apply_place", made.append)
    return made


def test_no_resize_is_not_a_place_to_take(applied) -> None:
    link = FakeLink(facts={live_key(2): LIVE_NOTICE})
    assert live.take_place(link, 3, wait_s=5.0) is False
    assert link.marked == [] and link.waited == [] and applied == []
    assert live.take_place(FakeLink(), 3, wait_s=5.0) is False  # no notice at all


def test_a_kept_rank_says_it_left_then_takes_its_place_from_go(applied) -> None:
    link = FakeLink(rank=2, attempt=2, facts={
        live_key(2): RESIZE_NOTICE,
        go_key(3): {"places": {"0": {**PLACE, "world_rank": 0}, "2": PLACE}}})
    assert live.take_place(link, 3, wait_s=7.0) is True
    assert link.marked == [(left_key(2, 2), True)]  # of the attempt it left
    assert link.waited == [(go_key(3), 7.0)]  # for the attempt it joins
    assert applied == [PLACE]


def test_a_kept_rank_waits_for_go_as_long_as_the_notice_says(applied) -> None:
    notice = {**RESIZE_NOTICE, "resize": {**RESIZE_NOTICE["resize"], "go_within_s": 125.0}}
    link = FakeLink(rank=2, attempt=2, facts={live_key(2): notice})
    with pytest.raises(PeersLostError, match=r"rank 2: the resize of attempt 2 was not in "
                                             r"place within 125 s \(HealthConfig\(live_wait_s\)"):
        live.take_place(link, 3, wait_s=30.0)
    assert link.waited == [(go_key(3), 125.0)]


def test_no_go_in_time_raises_peers_lost(applied) -> None:
    link = FakeLink(rank=2, attempt=2, facts={live_key(2): RESIZE_NOTICE})
    with pytest.raises(PeersLostError, match=r"rank 2: the resize of attempt 2 was not in "
                                             r"place within 1\.5 s"):
        live.take_place(link, 3, wait_s=1.5)
    assert link.marked == [(left_key(2, 2), True)] and applied == []


@pytest.mark.parametrize("go", [{"places": {"0": PLACE}}, {"places": None}, {}])
def test_no_place_in_the_resized_group_raises_peers_lost(applied, go) -> None:
    link = FakeLink(rank=2, attempt=2, facts={live_key(2): RESIZE_NOTICE, go_key(3): go})
    with pytest.raises(PeersLostError, match="rank 2: no place in the group resized for "
                                             "attempt 3; this worker stops"):
        live.take_place(link, 3, wait_s=1.0)
    assert applied == []


# -- apply_place -----------------------------------------------------------------------------
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


def test_a_place_is_written_to_rays_train_context_and_the_torch_variables(monkeypatch) -> None:
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.context import DistributedContext

    train_ctx = SimpleNamespace(distributed_context=DistributedContext(
        world_rank=2, world_size=4, local_rank=0, local_world_size=2, node_rank=1))
    monkeypatch.setattr(context, "get_train_context", lambda: train_ctx)
    for name, value in zip(TORCH_VARS, ("2", "4", "0", "2", "1"), strict=True):
        monkeypatch.setenv(name, value)
    live.apply_place(PLACE)
    assert train_ctx.distributed_context == DistributedContext(
        world_rank=1, world_size=3, local_rank=0, local_world_size=2, node_rank=1)
    assert {n: os.environ[n] for n in TORCH_VARS} == {
        "RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1"}


def test_a_place_sets_torch_variables_that_were_not_set(monkeypatch) -> None:
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.context import DistributedContext

    train_ctx = SimpleNamespace(distributed_context=DistributedContext(0, 2, 0, 2, 0))
    monkeypatch.setattr(context, "get_train_context", lambda: train_ctx)
    for name in TORCH_VARS:  # set first, so that monkeypatch removes them again after
        monkeypatch.setenv(name, "stale")
        monkeypatch.delenv(name)
    live.apply_place({"world_rank": 4, "world_size": 5, "local_rank": 1,
                      "local_world_size": 3, "node_rank": 2})
    assert [os.environ[n] for n in TORCH_VARS] == ["4", "5", "1", "3", "2"]
    assert train_ctx.distributed_context.world_rank == 4
