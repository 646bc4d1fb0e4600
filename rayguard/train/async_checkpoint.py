"""Asynchronous checkpoints: snapshot in the loop, persist in one background thread.

``report(state=...)`` with ``CheckpointConfig(mode="async")``:

1. in the loop: the intent gather (does any rank have a state at this step?), then, if the
   previous checkpoint still persists, wait for it (back-pressure: at most one in flight);
   then the snapshot (:mod:`rayguard.train.snapshot`) and the RNG state of this step;
2. in the background thread: exactly the synchronous protocol (write and hash, fsync, the
   records gather under its own tag, rank 0's commit), over a collective that does not feed
   the watchdog (the watchdog measures the loop's progress);
3. a failure there is raised in the loop at the next ``report``, or when the training
   function returns (:meth:`AsyncCheckpointer.drain`); the protocol never leaves a visible
   half checkpoint, so the previous verified one stays the one ``load_state()`` returns.

Sharded (DCP) saves stay synchronous: DCP's save is a collective on the default process
group, which the training loop uses at the same time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rayguard import runtime
from rayguard.train.snapshot import SnapshotBuffers

logger = logging.getLogger("rayguard")

POLL_S = 1.0
"""How often a back-pressure wait tells the watchdog the loop is alive."""


class AsyncCheckpointer:
    """One rank's background persistence: at most one checkpoint in flight."""

    def __init__(self, *, heartbeat: Callable[[], None] = lambda: None,
                 pin_memory: bool = True) -> None:
        self._heartbeat = heartbeat
        self._pool = runtime.pool(1, "rg-ckpt-persist")
        self._inflight: Future[Any] | None = None
        self._lock = threading.Lock()
        self.buffers = SnapshotBuffers(pin_memory=pin_memory)
        self.waits = 0
        """How many times a checkpoint waited for the previous one (back-pressure)."""
        self.waited_s = 0.0
        """Seconds the loop spent waiting for the previous checkpoint, in total."""
        self.snapshot_s = 0.0
        """Seconds of the last snapshot."""
        self.persist_s: float | None = None
        """Seconds the last finished background save took (the interval policy never asks
        for checkpoints faster than they persist)."""

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    def poll(self) -> Any:
        """The result of a finished background save (once), or ``None``; raises its error."""
        with self._lock:
            fut = self._inflight
            if fut is None or not fut.done():
                return None
            self._inflight = None
        return fut.result()

    def wait(self) -> tuple[float, Any]:
        """Back-pressure: wait for the checkpoint in flight (feeding the watchdog: waiting
        here is the loop's own work); returns (seconds waited, its result); raises its error."""
        fut = self._inflight
        if fut is None:
            return 0.0, None
        started = time.perf_counter()
        waited = not fut.done()
        self._await(fut, None)
        seconds = time.perf_counter() - started
        if waited:
            self.waits += 1
            self.waited_s += seconds
        return seconds, self.poll()

    def snapshot(self, state: Any) -> Any:
        """Copy ``state`` into this rank's reused host buffers (the loop may change it after)."""
        started = time.perf_counter()
        out = self.buffers.take(state)
        self.snapshot_s = time.perf_counter() - started
        return out

    def submit(self, persist: Callable[[], Any]) -> None:
        """Run ``persist`` in the background; the previous one must have been waited for."""
        with self._lock:
            if self._inflight is not None:
                raise RuntimeError("a checkpoint is still in flight: wait() first")
            self._inflight = self._pool.submit(self._timed, persist)

    def _timed(self, persist: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return persist()
        finally:
            self.persist_s = time.perf_counter() - started

    def drain(self, timeout_s: float | None = None) -> Any:
        """Wait for the checkpoint in flight (the training function returned or raised),
        feeding the watchdog; returns its result, raises its error. ``timeout_s``: stop
        waiting after that long (it is then still :attr:`in_flight`)."""
        fut = self._inflight
        if fut is None:
            return None
        if not self._await(fut, timeout_s):
            logger.warning("rayguard: the checkpoint in flight did not finish in %s s", timeout_s)
            return None
        return self.poll()

    def _await(self, fut: Future[Any], timeout_s: float | None) -> bool:
        """Wait for ``fut`` (at most ``timeout_s``), feeding the watchdog every POLL_S;
        ``True`` once it is done."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not fut.done():
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            try:
                fut.exception(timeout=left)
            except TimeoutError:
                pass
            self._heartbeat()
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=False)
