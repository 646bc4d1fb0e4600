"""Loops that report through ``ray.train.report`` get ``should_checkpoint()`` at the interval
too: the bridge tells the session of every report (checkpointed or not, and its time), and
the session brings rank 0's interval flag to the agreement, as ``rayguard.train.report``
does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import rayguard
from rayguard.checkpoint.interval import IntervalBounds, IntervalPolicy
from rayguard.train.context import GuardContext
from rayguard.train.pacing import CheckpointPacing
from rayguard.train.ray_report import RayReportBridge
from rayguard.train.rollback import RollBack
from rayguard.train.setup import build_session


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _session(tmp_path: Any, interval: bool = True) -> Any:
    ctx = GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       node_id="n0", device=torch.device("cpu"), seed=0, attempt=0,
                       run_dir=str(tmp_path))
    config = rayguard.GuardConfig(numa="off", checkpoint=rayguard.CheckpointConfig(
        interval=interval, min_interval_s=4, max_interval_s=4))
    return build_session(ctx, config, None, ())


def test_a_ray_train_report_loop_checkpoints_at_the_interval(tmp_path):
    session, clock = _session(tmp_path), Clock()
    policy = IntervalPolicy(IntervalBounds(4, 4), clock=clock)
    session.pacing = CheckpointPacing(policy)
    asked = []
    for step in range(1, 21):
        clock.t = float(step)
        save = session.should_checkpoint()
        asked += [step] if save else []
        session.paced(checkpointed=save, seconds=0.25)
    assert asked == [5, 10, 15, 20]  # due 4 s after the last save, saved at the next report
    assert policy.cost_s == 0.25  # the report's own time is the cost weighed


def test_a_loop_that_never_asks_is_left_alone_and_interval_false_turns_it_off(tmp_path):
    session, clock = _session(tmp_path), Clock()
    session.pacing = CheckpointPacing(IntervalPolicy(IntervalBounds(4, 4), clock=clock))
    clock.t = 9.0
    session.paced(checkpointed=False, seconds=0.1)
    assert session.should_checkpoint()  # due: the flag stays up until a checkpoint
    session.paced(checkpointed=True, seconds=0.1)
    assert not session.should_checkpoint()
    off = _session(tmp_path, interval=False)
    off.pacing = CheckpointPacing(IntervalPolicy(IntervalBounds(4, 4), clock=clock))
    clock.t = 100.0
    off.paced(checkpointed=False, seconds=0.1)
    assert not off.should_checkpoint()


class _Observer:
    last_step = -1
    nan_at: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.paced_calls: list[tuple[bool, float]] = []

    def observe(self, metrics: dict[str, Any], *, step: int | None = None,
                state: Any = None, defer_nan: bool = False) -> tuple[dict[str, Any], int]:
        self.deferred = defer_nan
        return metrics, 0 if step is None else step

    def agree_finite(self, step: int) -> None:
        if step in self.nan_at:  # as if some rank saw NaN at this report
            raise RollBack(step, reported=True)

    def observed(self, metrics: dict[str, Any], step: int, seconds: float) -> None:
        pass

    def paced(self, *, checkpointed: bool, seconds: float) -> None:
        self.paced_calls.append((checkpointed, seconds))

    def replays(self, before: int) -> None:
        pass


class _Link:
    ctx = SimpleNamespace(rank=0, world_size=1)
    peers = 1

    def contribute(self, tag: str, value: Any) -> None:
        pass

    def progress(self) -> None:
        pass


class _Forwarder:
    def submit(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def wait(self, future: Any, heartbeat: Any) -> None:
        pass


class _Inner:
    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def report(self, metrics: dict[str, Any], checkpoint: Any, *args: Any) -> None:
        self.reports.append(metrics)
        if checkpoint is not None:
            self.checkpoint = checkpoint

    checkpoint: Any = None

    def get_checkpoint(self) -> Any:
        return self.checkpoint


def test_the_bridge_tells_the_session_of_every_report():
    observer, inner = _Observer(), _Inner()
    bridge = RayReportBridge(observer, _Link(), _Forwarder(), None, None, inner)  # type: ignore[arg-type]
    bridge.report({"step": 3})
    bridge.report({"step": 4}, checkpoint=object())  # not a local directory: not sealed
    assert [c for c, _ in observer.paced_calls] == [False, True]
    assert all(s >= 0 for _, s in observer.paced_calls)
    assert inner.reports == [{"step": 3}, {"step": 4}]


class _Reported:
    def __init__(self, path: str) -> None:
        self.path = path


def test_under_live_recovery_a_nan_report_reaches_neither_ray_nor_the_pacing():
    observer, inner = _Observer(), _Inner()
    observer.nan_at = (5,)
    bridge = RayReportBridge(observer, _Link(), _Forwarder(), None, None, inner,  # type: ignore[arg-type]
                             in_place=True)
    bridge.report({"step": 4}, checkpoint=_Reported("/x/checkpoint_4"))
    assert observer.deferred
    with pytest.raises(RollBack) as raised:
        bridge.report({"step": 5, "loss": float("nan")})
    assert raised.value.reported and raised.value.step == 5
    assert inner.reports == [{"step": 4}]  # the NaN report never reached Ray's
    assert len(observer.paced_calls) == 1
    assert bridge.latest_reported() == "/x/checkpoint_4"


def test_after_a_rollback_get_checkpoint_chooses_again_from_the_agreed_path(monkeypatch):
    inner = _Inner()  # this rank never reported a checkpoint (rank 0 did)
    bridge = RayReportBridge(_Observer(), _Link(), _Forwarder(), None, _Store(), inner)  # type: ignore[arg-type]
    assert bridge.latest_reported() is None
    chosen: list[str] = []
    monkeypatch.setattr(bridge, "_agreed_choice", lambda latest: chosen.append(latest.path)
                        or latest)
    bridge.rolled_back("/run/checkpoint_5", reported=True)
    assert bridge.get_checkpoint().path == "/run/checkpoint_5"
    assert chosen == ["/run/checkpoint_5"]  # verified again under the new attempt
    assert bridge.latest_reported() == "/run/checkpoint_5"
    bridge.report({"step": 8}, checkpoint=_Reported("/run/checkpoint_8"))
    assert bridge.latest_reported() == "/run/checkpoint_8"  # Ray's own again
    bridge.rolled_back(None, reported=True)  # nothing reported anywhere: a fresh start
    assert bridge.get_checkpoint() is None


class _Store:
    fs = None
