"""How the ranks of a run agree during a checkpoint: a :class:`Collective`.

The commit protocol (:mod:`rayguard.train.protocol`) needs only this: the rank, the world
size, an all-gather by tag, an event log, a note that the rank is making progress, and the
run-wide list of rejected checkpoints. :class:`LinkCollective` is the real one (the run's
coordinator, through the worker's link); :class:`rayguard.testing.collective.ThreadGroup`
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

    def gather(self, tag: str, value: Any, root: int | None = None) -> list[Any]:
        """Every rank's ``value`` for ``tag``, in rank order (a tag is used once per attempt).
        ``root``: only that rank needs every value; the others may get the list with only
        the errors (exceptions) in place and ``None`` elsewhere (a commit's records)."""
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


class LinkCollective:
    """The real collective: the worker's :class:`~rayguard.run.link.RunLink` (its gather,
    event log and the run's rejected checkpoints).

    ``link.quiet()`` (a background checkpoint thread): waiting for peers does not feed the
    watchdog, which measures the training loop's progress, not the checkpoint's."""

    def __init__(self, link: Any) -> None:
        self._link = link
        self.rank = link.ctx.rank
        self.world_size = link.ctx.world_size
        self.node = str(link.ctx.node_id)

    def gather(self, tag: str, value: Any, root: int | None = None) -> list[Any]:
        return self._link.gather(tag, value, root=root)

    def record(self, kind: str, detail: str, **extra: Any) -> None:
        self._link.record(kind, detail, **extra)

    def progress(self) -> None:
        self._link.progress()

    def shared_rejections(self) -> dict[str, str]:
        return self._link.rejected_checkpoints()

    def share_rejection(self, path: str, why: str) -> None:
        self._link.reject_checkpoint(path, why)
