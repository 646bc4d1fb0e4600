"""A ``ray.train.report`` loop without a step key is counted across the run, not per attempt:
after ``get_checkpoint()`` offers the checkpoint sealed at step ``k``, the next report is
``k + 1`` on every rank (the one choice carries the sealed step); a step key wins as before.
The unit (the key found, or ``"report"``) is sealed in the manifest and put on the events."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rayguard.train.ray_report import (
    CHOSEN_KEY,
    RayReportBridge,
    report_step,
    report_unit,
    sealed_unit,
)
from rayguard.train.ray_seal import UNIT_FIELD, seal_metadata
from rayguard.train.steps import REPORT_UNIT, resumed_last_step


# -- the pure decisions -----------------------------------------------------------------------
@pytest.mark.parametrize(("offered", "sealed", "last", "expected"), [
    (True, 49, -1, 49),    # a new process resumes from the checkpoint sealed at 49
    (True, 49, 120, 49),   # an in-place rollback: back from 120 to 49
    (False, None, 120, -1),  # nothing offered: the loop starts fresh, so does the count
    (True, None, 7, 7),    # offered but unsealed (no manifest): the count is left as it is
    (True, 0, -1, 0),
])
def test_the_count_after_get_checkpoint_goes_on_from_the_sealed_step(offered, sealed, last,
                                                                     expected):
    assert resumed_last_step(offered, sealed, last) == expected


def _steps(reports: list[dict[str, Any]], last: int) -> list[int]:
    out = []
    for metrics in reports:
        last = report_step(metrics, last)
        out.append(last)
    return out


def test_reports_without_a_step_key_continue_from_k_plus_one_after_a_resume():
    plain = [{"loss": 1.0}] * 3
    assert _steps(plain, resumed_last_step(False, None, -1)) == [0, 1, 2]  # a fresh run
    assert _steps(plain, resumed_last_step(True, 49, -1)) == [50, 51, 52]  # resumed at 49


def test_a_step_key_is_the_step_whatever_the_resume():
    epochs = [{"loss": 1.0, "epoch": e} for e in (3, 4)]
    assert _steps(epochs, resumed_last_step(True, 2, -1)) == [3, 4]
    assert _steps([{"global_step": 900}], resumed_last_step(True, 2, -1)) == [900]


@pytest.mark.parametrize(("metrics", "unit"), [
    ({"loss": 1.0}, REPORT_UNIT),
    ({"loss": 1.0, "epoch": 3}, "epoch"),
    ({"step": 10, "epoch": 3}, "step"),           # first of STEP_KEYS wins, as for the step
    ({"step": True, "epoch": 3}, "epoch"),         # a bool is no step
    ({"training_iteration": 2}, "training_iteration"),
    ({"epoch": 1.5}, REPORT_UNIT),                 # not an integer: not read as the step
])
def test_the_unit_is_the_step_key_read_else_report(metrics, unit):
    assert report_unit(metrics) == unit


def test_the_manifest_records_the_unit_beside_the_step_when_known():
    records = [SimpleNamespace(rank=0), None]
    assert seal_metadata(2, records, "epoch") == {"attempt": 2, "reported_by": [0],
                                                  UNIT_FIELD: "epoch"}
    assert UNIT_FIELD not in seal_metadata(2, records, None)


def test_the_unit_is_read_back_from_a_sealed_local_checkpoint(tmp_path):
    from rayguard.checkpoint import reported

    (tmp_path / "model.pt").write_bytes(b"weights")
    record = reported.hash_directory(str(tmp_path), 0)
    reported.seal(str(tmp_path), [record], world_size=1, step=4,
                  metadata=seal_metadata(0, [record], "epoch"))
    assert sealed_unit(SimpleNamespace(fs=None), str(tmp_path)) == "epoch"
    assert sealed_unit(SimpleNamespace(fs=None), str(tmp_path / "missing")) is None
    assert sealed_unit(SimpleNamespace(fs=object()), str(tmp_path)) is None  # remote: unread


# -- the bridge on fakes: every rank agrees on the step ------------------------------------
class _Coordinator:
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}
        self.claims: set[str] = set()
        self.events: list[tuple[str, dict[str, Any]]] = []


class _Link:
    def __init__(self, coordinator: _Coordinator, rank: int) -> None:
        self.c = coordinator
        self.ctx = SimpleNamespace(rank=rank, attempt=1, world_size=2)
        self.peers = 2

    def get(self, key: str) -> Any:
        return self.c.facts.get(key)

    def claim(self, key: str) -> bool:
        first = key not in self.c.claims
        self.c.claims.add(key)
        return first

    def put(self, key: str, value: Any) -> None:
        self.c.facts[key] = value

    def wait_for(self, key: str) -> Any:
        return self.c.facts[key]

    def record(self, kind: str, detail: str, **extra: Any) -> None:
        self.c.events.append((kind, extra))

    def contribute(self, tag: str, value: Any) -> None:
        pass

    def progress(self) -> None:
        pass


class _Observer:
    """As the worker session: the step given is the step, and it becomes the last one."""

    def __init__(self) -> None:
        self.last_step = -1
        self.steps: list[int] = []
        self.replays_from: list[int] = []

    def observe(self, metrics: dict[str, Any], *, step: int | None = None, state: Any = None,
                defer_nan: bool = False) -> tuple[dict[str, Any], int]:
        assert step is not None
        self.last_step = step
        self.steps.append(step)
        return metrics, step

    def agree_finite(self, step: int) -> None:
        pass

    def observed(self, metrics: dict[str, Any], step: int, seconds: float) -> None:
        pass

    def paced(self, *, checkpointed: bool, seconds: float) -> None:
        pass

    def replays(self, before: int) -> None:
        self.replays_from.append(before)


class _Forwarder:
    def submit(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def wait(self, future: Any, heartbeat: Any) -> None:
        pass


class _Inner:
    def __init__(self, latest: Any) -> None:
        self.latest = latest

    def report(self, *args: Any) -> None:
        pass

    def get_checkpoint(self) -> Any:
        return self.latest


def _bridge(coordinator: _Coordinator, rank: int, latest: Any) -> RayReportBridge:
    return RayReportBridge(_Observer(), _Link(coordinator, rank), _Forwarder(),  # type: ignore[arg-type]
                           None, SimpleNamespace(fs=None), _Inner(latest))  # type: ignore[arg-type]


def test_every_rank_counts_on_from_the_step_the_one_choice_carries(monkeypatch):
    latest = SimpleNamespace(path="/run/checkpoint_000004", filesystem=None)
    coordinator = _Coordinator()
    chooser, waiter = _bridge(coordinator, 0, latest), _bridge(coordinator, 1, latest)
    monkeypatch.setattr(chooser, "_choose", lambda latest: (latest.path, 49))
    assert chooser.get_checkpoint() is latest
    assert coordinator.facts[CHOSEN_KEY.format(attempt=1)] == ("/run/checkpoint_000004", 49)
    assert waiter.get_checkpoint() is latest  # read from the chooser's answer, not chosen again
    for bridge in (chooser, waiter):
        assert bridge.observer.replays_from == [-1]  # type: ignore[attr-defined]
        assert bridge.sealed_step == 49
        bridge.report({"loss": 0.5})
        bridge.report({"loss": 0.4})
        assert bridge.observer.steps == [50, 51]  # type: ignore[attr-defined]
        assert bridge.unit == bridge.observer.step_unit == REPORT_UNIT  # the progress line's
        bridge.report({"loss": 0.3, "epoch": 7})
        assert bridge.observer.step_unit == "epoch"  # type: ignore[attr-defined]


def test_nothing_chosen_is_a_fresh_count_on_every_rank(monkeypatch):
    latest = SimpleNamespace(path="/run/checkpoint_000004", filesystem=None)
    coordinator = _Coordinator()
    chooser, waiter = _bridge(coordinator, 0, latest), _bridge(coordinator, 1, latest)
    monkeypatch.setattr(chooser, "_choose", lambda latest: (None, None))
    for bridge in (chooser, waiter):
        bridge.observer.last_step = 120  # an in-place rollback's process had reached 120
        assert bridge.get_checkpoint() is None
        assert bridge.observer.replays_from == []  # type: ignore[attr-defined]
        bridge.report({"loss": 0.5})
        assert bridge.observer.steps == [0]  # type: ignore[attr-defined]


def test_the_commit_event_names_the_unit():
    coordinator = _Coordinator()
    bridge = _bridge(coordinator, 0, None)
    bridge.report({"loss": 0.5, "epoch": 3})
    bridge._persisted(3, "/run/checkpoint_000003")
    kind, extra = coordinator.events[-1]
    assert kind == "checkpoint_committed" and extra["step_unit"] == "epoch"


# -- the commit of a sealed checkpoint records the bytes its manifest seals -----------------
class _SealingLink(_Link):
    """One rank alone: every meeting is its own value."""

    alone = False

    def __init__(self, coordinator: _Coordinator) -> None:
        super().__init__(coordinator, 0)
        self.ctx = SimpleNamespace(rank=0, attempt=1, world_size=1)

    def gather(self, tag: str, value: Any) -> list[Any]:
        return [value]

    def quiet(self) -> _SealingLink:
        return self


class _UploadingInner(_Inner):
    """Ray's report in its order for one rank: the upload (SYNC now, ASYNC too: played in
    the calling thread), none for NO_UPLOAD."""

    def report(self, metrics: Any, checkpoint: Any, name: Any, mode: Any, delete: Any,
               upload: Any, validation: Any) -> None:
        from rayguard._ray.report import CheckpointUploadMode

        if checkpoint is not None and mode != CheckpointUploadMode.NO_UPLOAD:
            upload(checkpoint, "checkpoint_000003")


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC", "NO_UPLOAD"])
def test_a_sealed_checkpoint_s_commit_records_its_sealed_bytes(tmp_path, mode):
    from rayguard._ray.report import CheckpointUploadMode
    from rayguard.checkpoint.manifest import read_manifest
    from rayguard.observe.timeline import build_run

    (tmp_path / "model.safetensors").write_bytes(b"w" * 1000)
    (tmp_path / "optimizer.pt").write_bytes(b"o" * 24)
    coordinator = _Coordinator()
    bridge = RayReportBridge(_Observer(), _SealingLink(coordinator), _Forwarder(),  # type: ignore[arg-type]
                             None, SimpleNamespace(fs=None), _UploadingInner(None))  # type: ignore[arg-type]
    checkpoint = SimpleNamespace(path=str(tmp_path), filesystem=None)
    bridge.report({"loss": 0.5, "step": 3}, checkpoint,
                  checkpoint_upload_mode=CheckpointUploadMode(mode),
                  checkpoint_upload_fn=lambda c, name: c)
    [(kind, extra)] = coordinator.events
    assert kind == "checkpoint_committed"
    assert extra["bytes"] == read_manifest(tmp_path).size_bytes == 1024
    events = [{"time": 1.0, "kind": "attempt_started", "attempt": 1},
              {"time": 2.0, "kind": kind, "attempt": 1, **extra}]
    assert build_run(events)["summary"]["checkpoint_bytes"] == 1024


def test_after_reporting_a_checkpoint_get_checkpoint_is_rays_latest(monkeypatch, tmp_path):
    """As with TorchTrainer (Ray's own mixed-upload-modes test asks it after each report):
    once this rank reported a checkpoint in the attempt, get_checkpoint() is Ray's latest,
    not the choice made at the start."""
    from ray.train import Checkpoint

    start = SimpleNamespace(path="/run/checkpoint_000004", filesystem=None)
    coordinator = _Coordinator()
    bridge = _bridge(coordinator, 0, start)
    monkeypatch.setattr(bridge, "_choose", lambda latest: (latest.path, 4))
    assert bridge.get_checkpoint() is start
    (tmp_path / "shard_0").write_bytes(b"x")
    reported = Checkpoint.from_directory(str(tmp_path))
    bridge.inner.latest = reported  # type: ignore[attr-defined]  # what Ray holds after it
    monkeypatch.setattr(bridge.sealer, "prepare", lambda *a, **k: SimpleNamespace(
        upload=None, persisted_at_report=False, sealed_bytes=None))  # sealing: ray_seal's tests
    bridge.report({"loss": 0.5}, checkpoint=reported)
    assert bridge.get_checkpoint() is reported
    bridge.rolled_back("/run/checkpoint_000004", reported=True)  # a rollback chooses again
    assert bridge.get_checkpoint() is not reported
