"""The step figures of one attempt for the goodput planner (pure, no Ray): the lead rank's
step summaries, the time per step, when the first step began, and the replay in optimizer
steps of a loop that reports rarer than it steps its optimizers
(:mod:`rayguard.observe.goodput`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayguard.events.fields import event_time, integer, number


def lead_steps(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lead rank's (lowest rank's) step summaries of one attempt."""
    steps = [e for e in evs if e.get("kind") == "steps" and integer(e.get("rank")) is not None]
    if not steps:
        return []
    lead = min(int(e["rank"]) for e in steps)
    return [e for e in steps if e["rank"] == lead]


def step_time(steps: list[dict[str, Any]]) -> float | None:
    """Seconds per step: measured step time over the steps it covered."""
    total = sum(number(e.get("step_time_sum_s")) or 0.0 for e in steps)
    intervals = sum(integer(e.get("intervals")) or 0 for e in steps)
    firsts = [s for e in steps if (s := integer(e.get("first_step"))) is not None]
    lasts = [s for e in steps if (s := integer(e.get("last_step"))) is not None]
    if intervals <= 0:
        return None
    covered = (max(lasts) - min(firsts)) if firsts and lasts else 0
    return total / covered if covered > 0 else total / intervals


_REPORT_MARKS = ("fault_injected", "nan_detected", "diverged", "checkpoint_committed",
                 "preemption_notice")
"""Kinds recorded at a report, with its step: two of them time the steps between."""


def span_step_time(evs: list[dict[str, Any]], steps: list[dict[str, Any]]) -> float | None:
    """Seconds per step of an attempt whose summaries measured no interval (it ended before
    its second summary): its first report to the furthest later event recorded at a report
    (a fault fired, a NaN found, a commit, a notice), less the checkpoints' blocked time
    between, over the steps between."""
    starts = [(t, s) for e in steps if (t := number(e.get("first_time"))) is not None
              and (s := integer(e.get("first_step"))) is not None]
    if not starts:
        return None
    t0, s0 = min(starts)
    later = [(s, t) for e in evs if e.get("kind") in _REPORT_MARKS
             and (s := integer(e.get("step"))) is not None and s > s0
             and (t := event_time(e)) is not None and t > t0]
    if not later:
        return None
    s1, t1 = max(later)
    blocked = sum(max(number(e.get("blocked_s", e.get("seconds"))) or 0.0, 0.0) for e in evs
                  if e.get("kind") == "checkpoint_committed" and t0 < (event_time(e) or t0) <= t1)
    return max(t1 - t0 - blocked, 0.0) / (s1 - s0)


def first_step_start(first: float | None, steps: list[dict[str, Any]],
                      step_time_s: float | None) -> float | None:
    """When the attempt's first step began. The first report (``first_time``) ends it; when
    the summary says when the loop got its state back (``begin_time``), the step is counted
    as work at the attempt's measured time per step, never before ``begin_time`` (slower
    first steps, a warm-up, stay in the start-up or the load)."""
    begun = [b for e in steps if (b := number(e.get("begin_time"))) is not None]
    if first is None or not begun or step_time_s is None:
        return first
    return max(min(begun), first - step_time_s)


OPTIMIZER_UNIT = "optimizer_step"
"""The replay's unit for a loop that reports rarer than it steps its optimizers."""


@dataclass(frozen=True)
class OptimizerCounts:
    """What one attempt's lead rank counted of ``optimizer.step()`` (its step summaries), and
    the steps the planner finds it did again (``replayed``, in the loop's step unit)."""

    reports: int
    optimizer_steps: int
    """``optimizer.step()`` calls made before its reports."""
    replay_optimizer_steps: int
    """Of those, the ones made before its reports of replayed steps."""
    replayed: int


def optimizer_counts(steps: list[dict[str, Any]], replayed: int) -> OptimizerCounts:
    """The optimizer counts of an attempt's lead step summaries ``steps``."""
    def total(field: str) -> int:
        return sum(integer(e.get(field)) or 0 for e in steps)

    return OptimizerCounts(total("reports"), total("optimizer_steps"),
                           total("replay_optimizer_steps"), replayed)


def replay_in_optimizer_steps(attempts: list[OptimizerCounts]
                              ) -> tuple[list[int], list[int]] | None:
    """Each attempt's replay in optimizer steps, for a loop that reports rarer than it steps
    its optimizers (its lead rank made more ``optimizer.step()`` calls than reports over the
    run: a Trainer that reports every N steps); ``None`` for any other loop, whose replay
    stays in its step unit (one that reports every step, accumulates gradients over reports,
    or steps no torch optimizer). With it, the attempts whose count is estimated: none was
    counted while the planner finds steps done again (a log from before the count), at the
    run's optimizer steps per report."""
    reports = sum(a.reports for a in attempts)
    stepped = sum(a.optimizer_steps for a in attempts)
    if reports <= 0 or stepped <= reports:
        return None
    counts, estimated = [], []
    for i, a in enumerate(attempts):
        if a.replay_optimizer_steps or not a.replayed:
            counts.append(a.replay_optimizer_steps)
        else:
            counts.append(round(a.replayed * stepped / reports))
            estimated.append(i)
    return counts, estimated
