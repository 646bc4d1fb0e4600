"""Health decisions as data: a check's :class:`~rayguard.health.checks.Verdict` becomes one
:class:`Decision` (continue, restart, fail); each host has one executor that acts on it: a
worker raises (NaN) or kills itself (stall), a sweep restarts or fails the trial
(:mod:`rayguard._ray.tune`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rayguard.exceptions import HealthError, NonFiniteMetricError, StallError
from rayguard.health.checks import NONFINITE, STALL, STARTUP, Point, Verdict, check_nonfinite

Action = Literal["continue", "restart", "fail"]
RESTART: Action = "restart"
FAIL: Action = "fail"


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint a trial reported, in the order it reported them."""

    iteration: int
    """``training_iteration`` of the result the checkpoint came with."""
    path: str
    """Where the checkpoint lives (``Checkpoint.path``)."""
    source: Any = field(default=None, compare=False, repr=False)
    """What Tune restores from (its ``_TrainingResult``); opaque to the planner."""


@dataclass(frozen=True)
class Decision:
    """What to do about a verdict, and why."""

    action: Action
    """``"continue"``, ``"restart"`` or ``"fail"``."""
    verdict: Verdict | None = None
    """The finding acted on (``None`` for continue)."""
    reason: str = ""
    """A sentence for the event log and, on fail, the error."""
    checkpoint: CheckpointRecord | None = None
    """A sweep's restart: the checkpoint to restore (``None``: from scratch)."""
    restarts: int = 0
    """A sweep: health restarts of the trial once the decision is applied."""

    @property
    def ok(self) -> bool:
        return self.action == "continue"

    @property
    def check(self) -> str:
        return self.verdict.check if self.verdict else ""

    @property
    def value(self) -> Any:
        return self.verdict.value if self.verdict else None

    @property
    def threshold(self) -> Any:
        return self.verdict.threshold if self.verdict else None

    @property
    def trial_id(self) -> str:
        return self.verdict.trial_id if self.verdict else ""

    def error(self) -> HealthError:
        """The exception that ends what failed: :class:`StallError` for a stall (or a
        start-up that never reached a step), :class:`NonFiniteMetricError` for NaN/inf."""
        if self.check in (STALL, STARTUP):
            return StallError(self.reason)
        if self.check == NONFINITE:
            return NonFiniteMetricError(self.reason)
        return HealthError(self.reason)


CONTINUE = Decision("continue")


def check_finite(metrics: Mapping[str, Any], watch: Iterable[str], *, policy: str,
                 step: int | None = None) -> Decision:
    """A worker's NaN/inf guard over the watched metrics of one report: restart (or fail,
    ``policy="fail"``) on the first non-finite number; other types are not judged."""
    numbers = {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    verdict = check_nonfinite("", Point(step or 0, 0.0, numbers), tuple(watch), time.time())
    if verdict is None:
        return CONTINUE
    return Decision(FAIL if policy == "fail" else RESTART, verdict,
                    f"metric {verdict.metric!r} is {verdict.value} at step {step}")


def stall_decision(verdict: Verdict | None) -> Decision:
    """A worker's progress watchdog: a stall (or start-up) verdict restarts the group."""
    return CONTINUE if verdict is None else Decision(RESTART, verdict, verdict.detail)
