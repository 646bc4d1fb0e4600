"""How long a worker waits for the run's coordinator (:class:`LinkTimeouts`), and the one
question it asks before its link exists (:func:`read_attempt`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LinkTimeouts:
    """How long a worker waits for the coordinator, by kind of call (s; ``None``: no end)."""

    ack_s: float = 10.0
    """A fact or event that must arrive before this worker may go (marks, failure records,
    a waited-for event, the final metrics and step summary)."""
    answer_s: float | None = None
    """A question the worker cannot go on without (attempt, claim, get, rejections)."""
    fact_s: float = 1800.0
    """A fact another rank leaves (:meth:`RunLink.wait_for`)."""
    memory_s: float = 120.0
    """The memory tier's calls (a lost node answers with an error well before)."""
    poll_s: float = 1.0
    """How often a long wait wakes to feed the watchdog."""
    hold_s: float = 2.0
    """How long the coordinator (or the node's agent) holds a rank's question about a fact
    not there yet before it answers "not yet" (a long poll: a watched fact costs one call per
    ``hold_s``, answered the moment it appears). Short, so that a worker that is going (a
    SIGTERM'd rank handing its signal on) has no question outstanding for long: a 30 s hold
    kept a preempted worker alive past its checkpoint. An agent's own poll of the
    coordinator holds 30 s (``rayguard.run.agent.HOLD_S``)."""


def read_attempt(actor: Any, timeouts: LinkTimeouts = LinkTimeouts()) -> int:
    """The attempt this worker group runs (0 without a coordinator), read before the
    context (which holds it) exists."""
    if actor is None:
        return 0
    import ray

    return int(ray.get(actor.attempt.remote(), timeout=timeouts.answer_s))


__all__ = ["LinkTimeouts", "read_attempt"]
