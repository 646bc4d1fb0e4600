"""A real RunCoordinator called in this process through a stand-in for its actor handle
(``handle.method.remote(...)`` runs the method; ``ray.get`` returns what it is given)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayguard.run.coordinator import RunCoordinator


class InProcessHandle:
    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)

        class _Remote:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                return method(*args, **kwargs)

        return _Remote()


@pytest.fixture
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InProcessHandle:
    import ray

    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    return InProcessHandle(RunCoordinator(str(tmp_path / "events.jsonl")))


@pytest.fixture
def events(coordinator: InProcessHandle) -> Any:
    """``events()``: the events the coordinator wrote so far, in order."""
    path = Path(coordinator.target.events_file())

    def read() -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return read


@pytest.fixture
def harness(tmp_path: Path) -> Any:
    """``harness(loop, **kwargs)``: a :class:`~rayguard.testing.controller.ControllerHarness`
    in its own run directory under ``tmp_path``, closed after the test."""
    from rayguard.testing.controller import ControllerHarness

    made: list[ControllerHarness] = []

    def make(loop: Any, **kwargs: Any) -> ControllerHarness:
        made.append(ControllerHarness(tmp_path / f"h{len(made)}", loop, **kwargs))
        return made[-1]

    yield make
    for h in reversed(made):
        h.close()
