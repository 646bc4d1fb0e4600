"""An in-process :class:`~rayguard.train.collective.Collective`: N ranks as threads.

>>> group = ThreadGroup(world_size=2)
>>> results = group.run(lambda c: save(c, store, payload(c.rank), step=1, attempt=0, tag="r1"))

``kill(rank)`` (typically from a crash hook running in that rank's thread, which then blocks
like a SIGKILLed process would) makes every peer's pending and later ``gather`` raise
:class:`PeerLost`, as the run's coordinator ends a gather whose peers never arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rayguard import runtime
from rayguard.exceptions import RayGuardError


class PeerLost(RayGuardError):
    """A peer died before reaching a gather."""


class _Frozen(BaseException):
    """Unblocks a frozen (killed) rank's thread at the end of a test."""


class ThreadGroup:
    """Shared state of N in-process ranks: gathers by tag, an event log, rejections."""

    def __init__(self, world_size: int, *, timeout_s: float = 60.0, node: str = "local") -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.node = node
        self.events: list[dict[str, Any]] = []
        self.rejections: dict[str, str] = {}
        self.dead: set[int] = set()
        self.progress_calls = [0] * world_size
        self._values: dict[str, dict[int, Any]] = {}
        self._cond = threading.Condition()
        self._local = threading.local()
        self._release = threading.Event()

    def member(self, rank: int) -> ThreadMember:
        return ThreadMember(self, rank)

    def current_rank(self) -> int | None:
        """The rank whose thread is running (``None`` outside :meth:`run`)."""
        return getattr(self._local, "rank", None)

    # -- failure simulation ----------------------------------------------------------------
    def kill(self, rank: int) -> None:
        """Rank ``rank`` is gone: its peers' gathers raise PeerLost."""
        with self._cond:
            self.dead.add(rank)
            self._cond.notify_all()

    def freeze_here(self) -> None:
        """Called in a rank's thread: the rank dies here, leaving everything as it is (no
        clean-up runs until :meth:`release`, like a SIGKILL)."""
        rank = self.current_rank()
        assert rank is not None, "freeze_here() outside a rank's thread"
        self.kill(rank)
        self._release.wait()
        raise _Frozen()

    def release(self) -> None:
        """Let frozen threads unwind (at the end of a test)."""
        self._release.set()

    # -- running ----------------------------------------------------------------------------
    def run(self, fn: Callable[[ThreadMember], Any]) -> list[Any]:
        """``fn(member)`` on every rank in its own thread; returns each rank's result or the
        exception it raised (a killed rank: :class:`PeerLost`). Returns once every rank has
        finished or died."""
        results: list[Any] = [None] * self.world_size
        finished: set[int] = set()

        def body(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = fn(self.member(rank))
            except _Frozen:
                return
            except BaseException as exc:
                results[rank] = exc
            with self._cond:
                finished.add(rank)
                self._cond.notify_all()

        threads = [threading.Thread(target=runtime.carry(body), args=(r,), name=f"rank{r}",
                                    daemon=True)
                   for r in range(self.world_size)]
        for t in threads:
            t.start()
        with self._cond:
            if not self._cond.wait_for(lambda: finished | self.dead >= set(range(self.world_size)),
                                       timeout=self.timeout_s):
                raise TimeoutError(f"ranks {set(range(self.world_size)) - finished} never finished")
        for r in self.dead - finished:
            results[r] = PeerLost(f"rank {r} was killed")
        return results

    def _gather(self, rank: int, tag: str, value: Any) -> list[Any]:
        with self._cond:
            slot = self._values.setdefault(tag, {})
            slot[rank] = value
            self._cond.notify_all()

            def ready() -> bool:
                return len(slot) == self.world_size or bool(self.dead - set(slot))

            if not self._cond.wait_for(ready, timeout=self.timeout_s):
                raise PeerLost(f"rank {rank}: peers never reached {tag!r}")
            if len(slot) != self.world_size:
                raise PeerLost(f"rank {rank}: peers never reached {tag!r}")
            return [slot[r] for r in range(self.world_size)]


class ThreadMember:
    """One rank's :class:`~rayguard.train.collective.Collective` view of a ThreadGroup."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.node = group.node

    def gather(self, tag: str, value: Any, root: int | None = None) -> list[Any]:
        from rayguard.run.waits import errors_only

        values = self.group._gather(self.rank, tag, value)
        return values if root is None or root == self.rank else errors_only(values)

    def record(self, kind: str, detail: str, **extra: Any) -> None:
        with self.group._cond:
            self.group.events.append({"kind": kind, "detail": detail, "rank": self.rank, **extra})

    def progress(self) -> None:
        self.group.progress_calls[self.rank] += 1

    def shared_rejections(self) -> dict[str, str]:
        with self.group._cond:
            return dict(self.group.rejections)

    def share_rejection(self, path: str, why: str) -> None:
        with self.group._cond:
            self.group.rejections[path] = why
