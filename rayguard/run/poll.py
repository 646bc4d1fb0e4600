"""A fact of the run's coordinator watched without blocking (the hang diagnosis's open flag,
which every rank's watchdog checks up to 20 times a second): a long poll, one question in
flight, which the coordinator answers when the fact appears (or after ``hold_s``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rayguard")


class FactPoll:
    """A fact of the coordinator watched without blocking: at most one question in flight,
    held by the coordinator until the fact is there or ``hold_s`` passed, and at most one
    asked per ``every_s`` however often :meth:`value` is called (a short stall bound wakes
    the watchdog up to 20 times a second); :meth:`value` returns the last answer (``None``
    until the fact is there)."""

    def __init__(self, actor: Any, key: str, every_s: float = 1.0, hold_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._actor = actor
        self._key = key
        self._every_s = every_s
        self._hold_s = hold_s
        self._clock = clock
        self._asked: float | None = None
        self._ref: Any = None
        self._value: Any = None

    def value(self) -> Any:
        if self._value is not None or self._actor is None:
            return self._value
        import ray

        if self._ref is not None:
            ready, _ = ray.wait([self._ref], timeout=0)
            if not ready:
                return None
            try:
                self._value = ray.get(self._ref)
            except Exception as exc:  # the coordinator gone: ask again next time
                logger.debug("rayguard: could not read %s: %s", self._key, exc)
            self._ref = None
        now = self._clock()
        if self._value is None and (self._asked is None or now - self._asked >= self._every_s):
            self._asked = now
            self._ref = self._actor.wait_fact.remote(self._key, self._hold_s)
        return self._value
