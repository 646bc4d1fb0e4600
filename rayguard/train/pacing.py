"""The worker's side of the checkpoint interval: rank 0 decides, every rank agrees.

Rank 0 holds the :class:`~rayguard.checkpoint.interval.IntervalPolicy` of this attempt, started
from the run directory's history (earlier runs' and this run's restarts, and the costs of
the checkpoints committed, from the event log; else this attempt's number). At every report
rank 0 asks it whether a checkpoint is due and brings the answer as the ``interval`` flag of
the per-report agreement (:mod:`rayguard.train.agreement`): a MAX all-reduce, so every rank
learns it at the same report. From the next step on ``rayguard.train.should_checkpoint()``
is True on every rank until a report saves a checkpoint (as for a preemption notice). Every
save the ranks agree on, whoever asked for it, restarts the interval and tells the policy
its cost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from itertools import chain
from typing import TYPE_CHECKING, Any

from rayguard.checkpoint.interval import (
    DEFAULT_MTBF_S,
    IntervalBounds,
    IntervalDecision,
    IntervalPolicy,
)
from rayguard.checkpoint.interval_advice import FailureHistory, failure_history
from rayguard.config import CheckpointConfig
from rayguard.train.agreement import Flags

if TYPE_CHECKING:
    from rayguard.events.lines import EventSource

logger = logging.getLogger("rayguard")


def bounds_of(config: CheckpointConfig) -> IntervalBounds:
    return IntervalBounds(config.min_interval_s, config.max_interval_s,
                          DEFAULT_MTBF_S if config.mtbf_s is None else config.mtbf_s)


_HISTORY_TOKENS = (b'"start"', b'"restart"', b'"checkpoint_committed"')
"""A line holding none cannot be a ``start``, ``restart`` or ``checkpoint_committed`` event:
it is not parsed."""


def history_events(source: EventSource) -> Iterator[dict[str, Any]]:
    """The events of a log that its failure history needs, in file order: the first and the
    last, every ``start``, ``restart`` and ``checkpoint_committed`` (its cost), and the
    event before each (the end of a run).
    Streamed: memory bounded by a line, and only those lines are parsed (rank 0 reads this
    at set-up; a long run's log has 100 000s of lines)."""
    from rayguard.events.lines import LineReader
    from rayguard.events.read import parse_line

    reader = LineReader(source)
    first, prev = True, None
    for line in chain(reader.read(), (reader.finish(),)):
        if line is None or not line.strip():
            continue
        if first or any(token in line for token in _HISTORY_TOKENS):
            for raw in (prev, line):
                event = None if raw is None else parse_line(raw)
                if event is not None:
                    yield event
            first, prev = False, None
        else:
            prev = line
    event = None if prev is None else parse_line(prev)
    if event is not None:
        yield event


def read_history(run_dir: str, filesystem: Any, attempt: int) -> FailureHistory:
    """The run directory's failure history (at least this attempt's failures: the restart
    events of this run may not be in the log yet). Never raises: an unreadable log gives
    this attempt's number and no run time."""
    try:
        from rayguard.events.read import run_source

        history = failure_history(history_events(run_source(run_dir, filesystem)),
                                  now=time.time())
    except Exception as exc:
        logger.debug("rayguard: no failure history from the event log: %s", exc)
        return FailureHistory(0.0, attempt, 0)
    if history.failures >= attempt:
        return history
    # this run's restarts are not all in the log yet: the attempt started at a failure
    return replace(history, failures=attempt, at_last_failure_s=history.observed_s)


class CheckpointPacing:
    """One worker's interval flag and its agreed ``should_checkpoint``. ``policy``: rank 0's
    (``None``: this rank does not decide, or ``CheckpointConfig(interval=False)``)."""

    def __init__(self, policy: IntervalPolicy | None = None) -> None:
        self.policy = policy
        self.pending = False
        """Agreed by every rank: a checkpoint is due at the interval."""
        self.last: IntervalDecision | None = None
        """Rank 0's last decision (the figures behind the flag)."""

    def local_flag(self, *, in_flight: bool = False) -> bool:
        """Rank 0: is a checkpoint due by the interval (never while one is in flight)?"""
        if self.policy is None:
            return False
        self.last = self.policy.decide(in_flight=in_flight)
        return self.last.due

    def should_checkpoint(self) -> bool:
        return self.pending

    def resumed(self) -> None:
        """``load_state()`` restored a checkpoint: the interval counts from here."""
        if self.policy is not None:
            self.policy.resumed()

    def after_report(self, agreed: Flags, *, saved: bool, cost_s: float | None = None,
                     persist_s: float | None = None) -> None:
        """After a report's agreement (``saved``: every rank saved a checkpoint; ``cost_s``:
        the seconds this rank's loop was blocked by it)."""
        if persist_s is not None and self.policy is not None:
            self.policy.persisted(persist_s)
        if saved:
            self.pending = False
            if self.policy is not None and cost_s is not None:
                self.policy.saved(cost_s)
        elif agreed.interval:
            self.pending = True


def pacing_for(config: CheckpointConfig, ctx: Any, filesystem: Any = None) -> CheckpointPacing:
    """Set-up: rank 0 decides (from the run directory's failure history); the others only
    follow the agreement."""
    if not config.interval or ctx.rank != 0:
        return CheckpointPacing()
    history = read_history(ctx.run_dir, filesystem, ctx.attempt)
    return CheckpointPacing(IntervalPolicy(bounds_of(config), observed_s=history.observed_s,
                                           failures=history.failures,
                                           at_last_failure_s=history.at_last_failure_s,
                                           costs_s=history.costs_s))
