"""A ``steps`` event (one rank's step summary) as the readers of a whole log use it: typed
attributes instead of dictionary look-ups, so that a long log's hundreds of thousands of
summaries are folded without a dict per field.

Two classes give the same attributes: :class:`StepSummary`, built from any event dict
(each field checked the way the readers check it: a field of another type reads as
``None``), and :class:`rayguard.events.fast.StepLine`, decoded straight from a line by the
fast path. Readers take either.
"""

from __future__ import annotations

from typing import Any

from rayguard.events.fields import integer as _int
from rayguard.events.fields import is_number

NUMBER_FIELDS = ("time", "first_time", "last_time", "begin_time", "step_time_sum_s",
                 "replay_time_s")
"""Fields read as numbers (int or float, never a bool)."""
INT_FIELDS = ("attempt", "rank", "step", "first_step", "last_step", "intervals", "reports",
              "replay_steps", "optimizer_steps", "replay_optimizer_steps")
"""Fields read as integers (never a bool)."""


def _num(value: Any) -> int | float | None:
    """A number field as written (an int stays an int), else ``None``."""
    return value if is_number(value) else None


class StepSummary:
    """One ``steps`` event read from its dict. ``reach``: the step it shows the attempt
    reached (``last_step`` when the event has that field, else ``step``); ``metric`` and
    ``samples`` are as written (the readers check them); :meth:`event` is the dict."""

    __slots__ = (*NUMBER_FIELDS, *INT_FIELDS, "metric", "samples", "reach", "_event")

    time: int | float | None
    first_time: int | float | None
    last_time: int | float | None
    begin_time: int | float | None
    step_time_sum_s: int | float | None
    replay_time_s: int | float | None
    attempt: int | None
    rank: int | None
    step: int | None
    first_step: int | None
    last_step: int | None
    intervals: int | None
    reports: int | None
    replay_steps: int | None
    optimizer_steps: int | None
    replay_optimizer_steps: int | None
    metric: Any
    samples: Any
    reach: int | None

    def __init__(self, event: dict[str, Any]) -> None:
        for name in NUMBER_FIELDS:
            setattr(self, name, _num(event.get(name)))
        for name in INT_FIELDS:
            setattr(self, name, _int(event.get(name)))
        self.metric = event.get("metric")
        self.samples = event.get("samples")
        self.reach = _int(event.get("last_step", event.get("step")))
        self._event = event

    def event(self) -> dict[str, Any]:
        """The event without its metric samples (what a reader keeps of it)."""
        return {k: v for k, v in self._event.items() if k != "samples"}
