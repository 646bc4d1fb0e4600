"""FactPoll: a coordinator fact watched without blocking, asked at most once per interval."""

from __future__ import annotations

import pytest

from rayguard.run.poll import FactPoll


class Ref:
    pass


class Getter:
    def __init__(self, owner: Actor) -> None:
        self.owner = owner

    def remote(self, key: str, hold_s: float) -> Ref:
        self.owner.asked.append(key)
        self.owner.held.append(hold_s)
        return Ref()


class Actor:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.held: list[float] = []
        self.wait_fact = Getter(self)  # a long poll: the coordinator holds the question


@pytest.fixture
def answers(monkeypatch):
    """What ray.wait/ray.get give for every question: ready, with the current answer."""
    import ray

    state = {"value": None}
    monkeypatch.setattr(ray, "wait", lambda refs, timeout=0: (refs, []))
    monkeypatch.setattr(ray, "get", lambda ref: state["value"])
    return state


def test_asks_at_most_once_per_interval_however_often_it_is_read(answers) -> None:
    now = [0.0]
    actor = Actor()
    poll = FactPoll(actor, "diagnosis:0", every_s=1.0, hold_s=30.0, clock=lambda: now[0])
    for _ in range(20):  # twenty wake-ups within the first second
        assert poll.value() is None
        now[0] += 0.05
    assert actor.asked == ["diagnosis:0"]
    now[0] = 1.0
    poll.value()
    assert len(actor.asked) == 2
    answers["value"] = True
    now[0] = 1.5  # the question in flight is answered on the next read, before the interval
    assert poll.value() is True
    assert poll.value() is True and len(actor.asked) == 2  # known: never asked again
    assert actor.held == [30.0, 30.0]


def test_without_a_coordinator_it_never_asks() -> None:
    assert FactPoll(None, "").value() is None
