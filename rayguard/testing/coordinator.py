"""The run's coordinator in this process, run as the actor runs it: every method on one
event loop (a daemon thread here), awaited when it is a coroutine. Tests and benchmarks call
it from any thread, as ranks call the actor: ``c.gather(...)`` or ``c.gather.remote(...)``
(the value itself, for code that passes it to a stand-in ``ray.get``)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any


class _Method:
    def __init__(self, owner: InProcessCoordinator, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._owner.call(self._name, *args, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)


class InProcessCoordinator:
    """``target`` (a :class:`~rayguard.run.coordinator.RunCoordinator`) behind an event loop
    of its own; its attributes that are not methods read through."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="in-process-coordinator")
        self._thread.start()

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.target, name)

        async def run() -> Any:
            out = method(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        return _Method(self, name) if callable(value) else value

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def memory_copies(coordinator: Any) -> list[tuple[str, int, str, str | None]]:
    """``(path, rank, node, peer node or None)`` of every memory-tier copy the run's
    coordinator actor holds, read off the actor with Ray's ``__ray_call__`` (the actor has no
    method for tests)."""
    import ray

    return ray.get(coordinator.__ray_call__.remote(
        lambda actor: [(s.path, s.rank, s.node, s.peer) for s in actor._memory.held()]))


__all__ = ["InProcessCoordinator", "memory_copies"]
