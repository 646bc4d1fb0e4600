"""Errors rayguard raises. Every one says what happened, where, and what to do.

They cross Ray process boundaries, so each keeps its constructor arguments in ``args``
and pickles with the default protocol.
"""

from __future__ import annotations


class RayGuardError(Exception):
    """Base class of every rayguard error."""


class ConfigError(RayGuardError, ValueError):
    """A configuration value is invalid. The message names the field, the value and the fix."""


def config_error(owner: str, field: str, value: object, why: str, fix: str) -> ConfigError:
    """Build the one message shape used for every bad config value.

    ``ConfigError("HealthConfig(stall_timeout_s=0): must be > 0. Fix: ...")``
    """
    return ConfigError(f"{owner}({field}={value!r}): {why}. Fix: {fix}")


class RayVersionError(ConfigError):
    """The installed Ray lacks an internal rayguard relies on (see ``docs/compatibility.md``).
    The message names the Ray version, what is missing, and the supported range to install."""


class WorkerSetupError(RayGuardError):
    """A worker could not be set up before the user's training function (device, env, NUMA)."""


class FaultSpecError(ConfigError):
    """A fault-injection spec (``RAYGUARD_FAULTS``) could not be parsed."""


class InjectedFault(RayGuardError):
    """Raised by the ``raise`` fault of :mod:`rayguard.testing`."""


class CheckpointError(RayGuardError):
    """A checkpoint could not be written, committed or verified."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint failed verification (missing file, wrong size, wrong sha256, bad path)."""


class HealthError(RayGuardError):
    """A health check decided that the run must stop (NaN after the restart budget, ...)."""


class StallError(HealthError):
    """A rank made no progress for longer than its stall timeout."""


class NonFiniteMetricError(HealthError):
    """A watched metric was NaN or inf."""


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
