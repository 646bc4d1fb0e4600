"""The one classification of a worker's failure (pure): :func:`classify`.

A failure has a ``cause`` from one vocabulary (:data:`CAUSES`, most severe first: an attempt
in which several ranks failed reads as its most severe cause, :func:`most_severe`), whether
it is ``fatal``, and its ``retry`` policy (:mod:`rayguard.failures.fatal`). The ``cause``
values are the ones a ``restart`` event, ``rayguard report`` and the ``rayguard_restarts``
metric show, and a ``worker_died`` event's ``failure`` field. ``label`` is a finer name
(``injected kill``, ``stall``, ``startup``, ``died``, ``nan``, ``error``) for the controller
(quarantine does not count an injected kill against a node); no event carries it, the
one-line ``reason`` (an event's ``detail``) says the same in words.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rayguard.exceptions import NonFiniteMetricError
from rayguard.failures.fatal import AFTER_ONE_REPEAT, NOT_RETRIED, RETRIED, fatal_cause
from rayguard.failures.patterns import reads_as_collateral, text_cause
from rayguard.faults.spec import read_injected_mark

CAUSES = ("hang", "nan", "preflight", "config", "setup", "checkpoint", "oom", "preemption",
          "kill", "error", "unknown")
"""Every cause, most severe first. ``hang``: rayguard's watchdog ended a rank that made no
progress; ``nan``: a watched metric was NaN/inf; ``preflight``, ``config``, ``setup``,
``checkpoint``: never retried (:mod:`rayguard.failures.fatal`); ``oom``: out of memory;
``preemption``: the node went away; ``kill``: the worker process died (killed, segfault);
``error``: an exception in the training function; ``unknown``: nothing says."""

_RAY_DEATHS = ("RayActorError", "ActorDiedError", "ActorUnavailableError")


@dataclass(frozen=True)
class Failure:
    """How one worker failed, as the controller records it in ``worker_died``."""

    cause: str
    """One of :data:`CAUSES`."""
    label: str
    """A finer name than ``cause``: an injected fault as marked (``injected kill``), the
    watchdog's bound (``stall``, ``startup``), ``nan``, ``died``, ``error``."""
    reason: str
    """One line: what happened, for a person."""
    fatal: bool
    """A restart cannot fix it: the run ends at once."""
    retry: str
    """``retried``, ``after_one_repeat`` (the crash-loop rule) or ``not_retried``."""
    error_type: str
    """Qualified name of the exception type, e.g. ``builtins.ValueError``."""
    origin: str
    """The innermost frame of the traceback, ``file:line in function`` (``<unknown>`` once
    the exception crossed a process)."""
    summary: str
    """``Type: first line of the message``."""
    details: str = ""
    """``Type: the whole message`` (at most 20000 characters)."""

    def event_fields(self) -> dict[str, Any]:
        """The fields a ``worker_died`` event carries: ``failure`` (the cause), ``fatal``,
        ``retry``, ``error_type`` and the whole text in ``details`` (the one-line reason is
        the event's ``detail``)."""
        return {"failure": self.cause, "fatal": self.fatal, "retry": self.retry,
                "error_type": self.error_type, "details": self.details}


def most_severe(causes: Iterable[str]) -> str:
    """The most severe of ``causes`` in :data:`CAUSES` order (``unknown`` when none)."""
    known = [c for c in causes if c in CAUSES]
    return min(known, key=CAUSES.index) if known else "unknown"


def _origin(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    return (f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
            if frames else "<unknown>")


def _died(exc: BaseException) -> bool:
    return hasattr(exc, "health_check_failure") or type(exc).__name__ in _RAY_DEATHS


def _label_reason(exc: BaseException, mark: str | None, died: bool) -> tuple[str, str]:
    """The finer label and the one-line reason. A NaN the guard detected reads as
    ``nan`` even when the NaN was injected (the reason says so): the guard stopped it. An
    injected fault's reason names where it was given (``GuardConfig(faults=...)`` or
    ``RAYGUARD_FAULTS``)."""
    name = type(exc).__name__
    lines = [line for line in str(exc).splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    injected = read_injected_mark(mark)
    if isinstance(exc, NonFiniteMetricError):
        note = (f" (the NaN was injected: {injected[1]})"
                if injected is not None and injected[0] == "injected nan" else "")
        return "nan", f"{name}: {first[:300]}{note}"
    if injected is not None:
        label, source = injected
        return label, f"{label} ({source})"
    if mark and mark.startswith("killed by rayguard"):
        return mark.rsplit(": ", 1)[-1], f"{mark} (see the stall_detected event)"
    if died:
        return "died", f"worker process died ({name}: {first[:200]})"
    return "error", f"{name}: {first[:300]}"


def is_kill_mark(mark: object) -> bool:
    """Whether a worker's mark says it was killed on purpose: by rayguard's watchdog
    (``killed by rayguard: <bound>``) or by an injected kill."""
    injected = read_injected_mark(mark)
    return isinstance(mark, str) and (mark.startswith("killed by rayguard")
                                      or (injected is not None and injected[0] == "injected kill"))


def classify(exc: BaseException, mark: str | None = None) -> Failure:
    """The one classification of a worker's failure.

    ``exc``: the worker's exception itself (Ray's wrapper removed, as
    ``rayguard._ray.train.unwrap_worker_error`` does). ``mark``: what the worker left with
    the run's coordinator before it went (``injected <fault>``, or ``killed by rayguard:
    <bound>`` when rayguard's watchdog ended it)."""
    cls = type(exc)
    message = str(exc)
    lines = message.strip().splitlines()
    summary = f"{cls.__name__}: {lines[0]}" if lines else cls.__name__
    error_type = f"{cls.__module__}.{cls.__qualname__}"
    killed = is_kill_mark(mark)
    died = _died(exc)
    label, reason = _label_reason(exc, mark, died)
    details = f"{cls.__name__}: {message}"[:20000]
    fatal = fatal_cause(exc)
    if fatal is not None:
        cause = fatal
    elif isinstance(exc, NonFiniteMetricError):
        cause = "nan"
    elif mark and str(mark).startswith("killed by rayguard"):
        cause = "hang"
    else:
        cause = text_cause(f"{reason} {details}")
    if fatal is not None:
        retry = NOT_RETRIED
    elif died or killed or reads_as_collateral(error_type, summary):
        retry = RETRIED
    else:
        retry = AFTER_ONE_REPEAT
    return Failure(cause=cause, label=label, reason=reason, fatal=fatal is not None,
                   retry=retry, error_type=error_type, origin=_origin(exc), summary=summary,
                   details=details)
