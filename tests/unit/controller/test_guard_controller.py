"""GuardController (rayguard._ray.resize), the controller of live runs: a worker replaced
alone that meets another dead worker restarts the whole group instead of ending the run
(Ray's replica-group replacement calls every other worker first, and its RayActorError was a
ControllerError Ray never retries: a bad node killing both its workers ended the run). Ray's
own controller methods are replaced by recorders; the decision is the subclass's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray

import rayguard._ray.resize as ray_resize
from rayguard._ray.resize import GuardController
from rayguard.controller.callbacks import RayGuardCallback
from rayguard.health.recovery import LIVE


class _Remote:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


def controller(callbacks: list[Any]) -> Any:
    """A GuardController without Ray's __init__: the attributes its override reads."""
    ctl = GuardController.__new__(GuardController)
    ctl._worker_group = SimpleNamespace(get_workers=lambda: [object(), object()])
    ctl._controller_callbacks = callbacks
    ctl._worker_group_callbacks_to_propagate = []
    return ctl


@pytest.fixture
def restarts(monkeypatch) -> list[Any]:
    made: list[Any] = []
    monkeypatch.setattr(ray_resize, "_restart", lambda ctl, decision: made.append(decision)
                        or "restarted")
    return made


def dead_peer(self: Any, decision: Any) -> Any:
    raise ray.exceptions.ActorDiedError()


def test_a_replacement_that_meets_a_dead_worker_restarts_the_group(monkeypatch, restarts):
    recorded: list[dict] = []
    callback = RayGuardCallback(SimpleNamespace(record=_Remote(recorded.append)), mode=LIVE)
    callback._attempt = 3
    monkeypatch.setattr(ray_resize.TrainController, "_execute_resize_decision", dead_peer)
    decision = SimpleNamespace(num_workers=2)
    assert controller([callback])._execute_resize_decision(decision) == "restarted"
    assert restarts == [decision]
    (event,) = recorded
    assert event["kind"] == "restart" and event["attempt"] == 3
    assert "found another worker dead" in event["fallback"]


def test_other_errors_are_rays(monkeypatch, restarts):
    def broken(self: Any, decision: Any) -> Any:
        raise ValueError("not a dead actor")

    monkeypatch.setattr(ray_resize.TrainController, "_execute_resize_decision", broken)
    callback = RayGuardCallback(SimpleNamespace(record=_Remote(lambda e: None)), mode=LIVE)
    with pytest.raises(ValueError):
        controller([callback])._execute_resize_decision(SimpleNamespace(num_workers=2))
    assert restarts == []


def test_a_replacement_that_works_is_rays(monkeypatch, restarts):
    monkeypatch.setattr(ray_resize.TrainController, "_execute_resize_decision",
                        lambda self, decision: "replaced")
    callback = RayGuardCallback(SimpleNamespace(record=_Remote(lambda e: None)), mode=LIVE)
    assert controller([callback])._execute_resize_decision(
        SimpleNamespace(num_workers=2)) == "replaced"
    assert restarts == []
