"""Errors rayguard raises. Every one says what happened, where, and what to do.

They cross Ray process boundaries, so each keeps its constructor arguments in ``args``
and pickles with the default protocol.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

_C = TypeVar("_C", bound=type)

class RayGuardError(Exception):
    """Base class of every rayguard error."""


class ConfigError(RayGuardError, ValueError):
    """A configuration value is invalid. The message names the field, the value and the fix."""


def config_error(owner: str, field: str, value: object, why: str, fix: str) -> ConfigError:
    """Build the one message shape used for every bad config value.

    ``ConfigError("HealthConfig(stall_timeout_s=0): must be > 0. Fix: ...")``
    """
    return ConfigError(f"{owner}({field}={value!r}): {why}. Fix: {fix}")


class UnknownFieldError(ConfigError, TypeError):
    """A config was given a field it does not have (``HealthConfig(stall_timout_s=5)``). Also a
    ``TypeError``, what Python raises for an unexpected keyword, so ``except TypeError`` code
    keeps working."""


def unknown_field_error(owner: str, field: str, value: object,
                        valid: list[str]) -> UnknownFieldError:
    """``HealthConfig(stall_timout_s=5): no such field. Fix: stall_timeout_s=5 (HealthConfig's
    fields: ...)``, the nearest valid field first."""
    near = difflib.get_close_matches(field, valid, n=1, cutoff=0.6)
    fix = (f"did you mean {near[0]}={value!r}?" if near
           else f"use one of {owner}'s fields")
    return UnknownFieldError(f"{owner}({field}={value!r}): {owner} has no field {field!r}. "
                             f"Fix: {fix} ({owner}'s fields: {', '.join(valid)})")


def strict_fields(cls: _C) -> _C:
    """Class decorator for a config dataclass (put it above ``@dataclass``): an unknown keyword
    raises :func:`unknown_field_error` (the class, the field, the nearest valid field)
    instead of Python's bare ``TypeError``. The one mechanism every config uses."""
    import dataclasses

    init = cls.__init__  # type: ignore[misc]
    valid = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            if name not in valid:
                raise unknown_field_error(cls.__name__, name, value, valid)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def moved_fields(names: Iterable[str], home: str, use: str) -> Callable[[_C], _C]:
    """Class decorator (put it above :func:`strict_fields`): the fields ``names`` left the
    class for ``home``; a keyword among them raises an :class:`UnknownFieldError` naming every
    such keyword given, its value and the call that takes it (``use``, with ``{call}`` in
    place of ``home(...)``), instead of the generic "no such field"."""
    gone = frozenset(names)

    def decorate(cls: _C) -> _C:
        init = cls.__init__  # type: ignore[misc]

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            given = {name: value for name, value in kwargs.items() if name in gone}
            if given:
                listed = ", ".join(f"{k}={v!r}" for k, v in given.items())
                owner = cls.__name__
                raise UnknownFieldError(
                    f"{owner}({listed}): {owner} has no field {', '.join(map(repr, given))}; "
                    f"these settings live only in {home}. "
                    f"Fix: {use.format(call=f'{home}({listed})')}")
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return decorate


class RayVersionError(ConfigError):
    """The installed Ray lacks an internal rayguard relies on (see ``docs/compatibility.md``).
    The message names the Ray version, what is missing, and the supported range to install."""


class PeersLostError(RayGuardError):
    """A wait for every rank was released: a peer failed and the run's coordinator opened a
    live recovery (``GuardConfig(recovery="live")``); the survivors rejoin."""


class WorkerSetupError(RayGuardError):
    """A worker could not be set up before the user's training function (device, env, NUMA)."""


class FaultSpecError(ConfigError):
    """A fault-injection spec (``RAYGUARD_FAULTS``) could not be parsed."""


class InjectedFault(RayGuardError):
    """Raised by the ``raise`` fault of :mod:`rayguard.testing`."""


class CheckpointError(RayGuardError):
    """A checkpoint could not be written, committed or verified."""


class ShardedStateError(CheckpointError):
    """``state=``/``sharded=`` were misused (a DTensor in ``state=``, ``sharded=`` on some
    ranks only): the same on every attempt, so the run ends without a retry."""

    fatal = True


class UnsealableCheckpointError(CheckpointError):
    """A directory given to ``ray.train.report`` holds something rayguard cannot seal (a
    symbolic link, a FIFO): the loop writes it the same way on every attempt, so a restart
    cannot fix it."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint failed verification (missing file, wrong size, wrong digest, bad path)."""


class HealthError(RayGuardError):
    """A health check decided that the run must stop (NaN after the restart budget, ...)."""


class StallError(HealthError):
    """A rank made no progress for longer than its stall timeout."""


class NonFiniteMetricError(HealthError):
    """A watched metric was NaN or inf."""


class DivergedMetricError(NonFiniteMetricError):
    """A watched metric diverged (``HealthConfig(divergence=...)``): handled as a NaN is,
    and counted under the same cause (``nan``: an unhealthy metric)."""


class FatalNonFiniteMetricError(NonFiniteMetricError):
    """NaN/inf with ``nan_policy="fail"``: the run ends without a retry."""

    fatal = True


class UnmatchedReportError(HealthError):
    """A rank waits in ``ray.train.report`` after every other rank's training function
    returned: Ray's report meets every rank, so it would wait forever. The loop reports a
    different number of times on different ranks; a restart would do the same."""

    fatal = True


class PreflightError(RayGuardError):
    """A preflight (doctor) check found an error at worker start-up."""


class SerializationError(RayGuardError):
    """A tensor could not be serialized or deserialized (dtype, shape and device are named)."""


class StateNotCheckpointableError(SerializationError):
    """A value passed to ``report(state=...)`` cannot be checkpointed. The same value fails
    on every attempt, so the run ends at once instead of restarting."""

    fatal = True


class WorkerTraceback(RayGuardError):
    """The traceback of an exception raised in a worker, as text: the cause of the user's
    exception when ``fit()`` raises (tracebacks do not cross processes)."""

    def __str__(self) -> str:
        return "\n" + (self.args[0] if self.args else "")
