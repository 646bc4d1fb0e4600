"""Health decisions as data: checks return a Decision; one executor acts on it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["continue", "restart", "fail"]


@dataclass(frozen=True)
class Decision:
    """What a health check concluded, and why."""

    action: Action
    check: str = ""
    reason: str = ""
    value: Any = None
    threshold: Any = None

    @property
    def ok(self) -> bool:
        return self.action == "continue"


CONTINUE = Decision("continue")


def check_finite(metrics: Mapping[str, Any], watch: Iterable[str], *, policy: str,
                 step: int | None = None) -> Decision:
    """NaN/inf guard over the watched metrics of one report."""
    for name in watch:
        value = metrics.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            action: Action = "fail" if policy == "fail" else "restart"
            return Decision(
                action, check="nan", value=value, threshold="finite",
                reason=f"metric {name!r} is {value} at step {step}",
            )
    return CONTINUE


def check_stall(now: float, last_progress: float, timeout_s: float, *,
                bound: str = "stall") -> Decision:
    """Progress watchdog: no progress for longer than the timeout means stuck. ``bound``:
    ``"stall"`` (since the last step) or ``"startup"`` (no step completed yet)."""
    idle = now - last_progress
    if idle > timeout_s:
        if bound == "startup":
            why = (f"no first step {idle:.1f} s after start-up "
                   f"(start-up timeout {timeout_s:.1f} s, HealthConfig.startup_timeout_s)")
        else:
            why = (f"no progress for {idle:.1f} s "
                   f"(stall timeout {timeout_s:.1f} s, HealthConfig.stall_timeout_s)")
        return Decision("restart", check=bound, value=round(idle, 3), threshold=timeout_s,
                        reason=why)
    return CONTINUE
