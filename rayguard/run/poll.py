"""A fact of the run's coordinator watched without blocking (the hang diagnosis's open flag,
which every rank's watchdog checks about once a second)."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("rayguard")


class FactPoll:
    """A fact of the coordinator watched without blocking: at most one question in flight;
    :meth:`value` returns the last answer (``None`` until the fact is there)."""

    def __init__(self, actor: Any, key: str) -> None:
        self._actor = actor
        self._key = key
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
        if self._value is None:
            self._ref = self._actor.get.remote(self._key)
        return self._value
