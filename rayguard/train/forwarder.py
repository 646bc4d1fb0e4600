"""Forwards reports to ``ray.train.report`` from a background thread, in order.

Ray Train's report blocks until the controller polls the worker (every 2 s by default), so a
loop that reports every step spends most of its time waiting. The user's call returns at
once; one thread forwards every report, in the order given, so Ray's callbacks and ``Result``
see exactly the same sequence. ``flush()`` waits for all of them (at the end of the training
function, before a checkpoint is handed over, and on demand).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rayguard import runtime


class Forwarder:
    def __init__(self, name: str = "rayguard-report") -> None:
        self._queue: queue.Queue[tuple[Future, Callable[..., Any], tuple, dict] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._gate = threading.Event()  # cleared: hold the next report (live recovery)
        self._gate.set()
        self._dropped = False
        self._thread = threading.Thread(target=runtime.carry(self._run), name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        self.raise_if_failed()
        fut: Future = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until everything submitted so far has been forwarded."""
        marker = self.submit(lambda: None)
        marker.result(timeout=timeout_s)
        self.raise_if_failed()

    def close(self, timeout_s: float | None = None) -> None:
        self.flush(timeout_s)
        self._queue.put(None)

    def hold(self) -> None:
        """Start no further report until :meth:`resume` or :meth:`abandon` (the one being
        forwarded goes on)."""
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def abandon(self, timeout_s: float) -> bool:
        """Drop what is still queued, stop the thread, and wait up to ``timeout_s`` for the
        report it is forwarding now (live recovery: a survivor's reports of the lost attempt
        must not reach Ray's barriers of the next one). Returns whether the thread ended."""
        self._dropped = True
        self._queue.put(None)
        self._gate.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            self._gate.wait()
            if self._dropped:
                fut.cancel()
                continue
            if self._error is not None:
                fut.set_exception(self._error)
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # re-raised in the training thread
                self._error = exc
                fut.set_exception(exc)

    def wait(self, future: Future, on_wait: Callable[[], None]) -> Any:
        """Wait for a forwarded report (Ray's report may wait for the controller), calling
        ``on_wait`` every second (a wait is progress)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        while True:
            try:
                return future.result(timeout=1.0)
            except FutureTimeout:
                on_wait()

    def flush_quietly(self, timeout_s: float = 30) -> None:
        """:meth:`flush`, its error dropped (a failure being raised matters more)."""
        try:
            self.flush(timeout_s=timeout_s)
        except Exception:
            pass
