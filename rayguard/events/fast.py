"""The fast path for the bulk of a long log: step summaries (``steps`` lines, one per rank
every few seconds, most of a long run's log) decoded by msgspec into a typed record.

The record's schema is the bound: every field the run's coordinator writes in a ``steps``
event is declared with its type (integers within int64, numbers finite, strings valid
UTF-8 with no lone surrogate, ``samples`` a list of ``[step, value]`` pairs: three levels
deep), and a line with any other field, type or shape is not decoded here but by the
reference parser (:func:`rayguard.safejson.loads_line`). So this path accepts only lines that
parser accepts, with the same values: what it gives up on costs time, never an event.

msgspec (a C extension) reads such a line several times faster than the standard
library's parser followed by the bounds walk, and skips building a dict. Without msgspec
installed, :func:`decoder` returns ``None`` and every line takes the reference path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

try:
    import msgspec
except ImportError:  # optional: the reference path reads every line
    msgspec = None  # type: ignore[assignment]

MARKER = b'"steps"'
"""Bytes every ``steps`` line holds (its kind): other lines are not tried here."""

BASE = ("time", "kind", "rank", "node", "step", "attempt", "detail")
SUMMARY = ("reports", "intervals", "step_time_sum_s", "step_time_max_s", "blocked_sum_s",
           "blocked_max_s", "first_step", "last_step", "first_time", "last_time", "begin_time",
           "replay_time_s", "replay_steps", "optimizer_steps", "replay_optimizer_steps",
           "metric", "gpu_ids", "straggler_score")

if msgspec is not None:
    _Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
    _Num = Union[_Int, float]  # msgspec refuses NaN/Infinity and numbers past the float range
    _Sample = tuple[_Int, Union[_Int, float, str]]

    class StepLine(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
        """One ``steps`` line, typed (the attributes of
        :class:`rayguard.events.summary.StepSummary`)."""

        kind: Literal["steps"]
        time: _Num
        last_step: _Int | None  # required: ``reach`` is then ``last_step``, as for a dict
        rank: _Int | None = None
        node: str | None = None
        step: _Int | None = None
        attempt: _Int | None = None
        detail: str | None = None
        reports: _Int | None = None
        intervals: _Int | None = None
        step_time_sum_s: _Num | None = None
        step_time_max_s: _Num | None = None
        blocked_sum_s: _Num | None = None
        blocked_max_s: _Num | None = None
        first_step: _Int | None = None
        first_time: _Num | None = None
        last_time: _Num | None = None
        begin_time: _Num | None = None
        replay_time_s: _Num | None = None
        replay_steps: _Int | None = None
        optimizer_steps: _Int | None = None
        replay_optimizer_steps: _Int | None = None
        metric: str | None = None
        samples: list[_Sample] = []
        gpu_ids: list[_Int] | None = None
        straggler_score: _Num | None = None

        @property
        def reach(self) -> int | None:
            return self.last_step

        def event(self) -> dict[str, Any]:
            """The event without its metric samples (what a reader keeps of it); a summary
            field that is ``None`` (or was not in the line) is left out."""
            event = {name: getattr(self, name) for name in BASE}
            event.update((name, value) for name in SUMMARY
                         if (value := getattr(self, name)) is not None)
            return event

    _ERRORS: tuple[type[BaseException], ...] = (msgspec.DecodeError, msgspec.ValidationError,
                                                RecursionError)
    _decode = msgspec.json.Decoder(StepLine).decode


def decoder() -> tuple[Callable[[bytes], Any], tuple[type[BaseException], ...]] | None:
    """``(decode, errors)``: ``decode(line)`` gives the line's ``StepLine`` or raises one of
    ``errors`` for a line to read with the reference parser; ``None`` when msgspec is not
    installed."""
    return None if msgspec is None else (_decode, _ERRORS)
