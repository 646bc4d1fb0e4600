"""How the ranks of a run agree during a checkpoint: a :class:`Collective`.

The commit protocol (:mod:`rayguard.train.protocol`) needs only this: the rank, the world
size, an all-gather by tag, an event log, a note that the rank is making progress, and the
run-wide list of rejected checkpoints. :class:`SessionCollective` is the real one (the run's
coordinator, through the worker session); :class:`rayguard.testing.collective.ThreadGroup`
runs N ranks in threads of one process for unit tests. No Ray import.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Collective(Protocol):
    rank: int
    world_size: int
    node: str
    """Where this rank runs (for error messages)."""

    def gather(self, tag: str, value: Any) -> list[Any]:
        """Every rank's ``value`` for ``tag``, in rank order (a tag is used once per attempt)."""
        ...

    def record(self, kind: str, detail: str, **extra: Any) -> None:
        """Add an event to the run's log."""
        ...

    def progress(self) -> None:
        """This rank is making progress (feeds the watchdog where that is the loop's work)."""
        ...

    def shared_rejections(self) -> dict[str, str]:
        """Checkpoints any rank or attempt of this run rejected, and why."""
        ...

    def share_rejection(self, path: str, why: str) -> None:
        ...


class SessionCollective:
    """The real collective: the worker session's coordinator.

    ``in_loop=False`` (a background checkpoint thread): waiting for peers does not feed the
    watchdog, which measures the training loop's progress, not the checkpoint's."""

    def __init__(self, session: Any, *, in_loop: bool = True) -> None:
        """``session``: the :class:`~rayguard.train.session.WorkerSession` (not imported here,
        so that neither module imports the other)."""
        self._session = session
        self._in_loop = in_loop
        self.rank = session.ctx.rank
        self.world_size = session.ctx.world_size
        self.node = str(session.ctx.node_id)

    def gather(self, tag: str, value: Any) -> list[Any]:
        return self._session.gather(tag, value, feed_watchdog=self._in_loop)

    def record(self, kind: str, detail: str, **extra: Any) -> None:
        self._session.record(kind, detail, **extra)

    def progress(self) -> None:
        if self._in_loop:
            self._session.watchdog.heartbeat()

    def shared_rejections(self) -> dict[str, str]:
        coordinator = self._session.coordinator
        if coordinator is None:
            return {}
        import ray

        return dict(ray.get(coordinator.rejected_checkpoints.remote()))

    def share_rejection(self, path: str, why: str) -> None:
        coordinator = self._session.coordinator
        if coordinator is not None:
            coordinator.reject_checkpoint.remote(path, why)
