"""The caller's SIGINT handler, kept across Ray Train's ``fit()``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigint_handler_kept() -> Iterator[None]:
    """Ray's ``fit()`` installs a SIGINT handler holding the run's controller handle and
    leaves it installed: the finished controller then lives on, and with it its worker
    groups' placement groups (one per rank under live recovery: the workers' CPUs stay
    reserved) until the next ``fit()`` replaces the handler. The caller's handler is put back
    when ``fit()`` ends, so the handle is dropped and Ray ends the controller."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Ray installs none there (a Tune trial)
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


__all__ = ["sigint_handler_kept"]
