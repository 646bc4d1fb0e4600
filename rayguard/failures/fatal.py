"""Which failures a restart cannot fix, and how each kind of failure is retried: the one
table (documented in ``docs/failure-handling.md``).

Retry policies:

* :data:`RETRIED`: a worker died (SIGKILL, OOM killer, node loss, rayguard's watchdog) or
  raised an error that follows a peer's death (gloo/NCCL connection errors): the worker
  group restarts within Ray's budget (``FailureConfig(max_failures=...)``).
* :data:`AFTER_ONE_REPEAT`: any other exception raised by the training function is
  retried, but the same exception from the same frame ending consecutive attempts with no
  durable progress in between is a crash loop (:mod:`rayguard.health.crash_loop`): after
  ``HealthConfig(crash_loop_retries=1)`` such repeat(s) the run ends.
* :data:`NOT_RETRIED`: the exceptions below, the same on every attempt by construction.

Never retried (``fatal``), by the cause they are reported as:

=================================  ============  ==============================================
exception                          cause         why a restart cannot fix it
=================================  ============  ==============================================
``ConfigError`` (and its           config        a bad config value, an unknown field, an
subclasses)                                      unsupported Ray, a bad ``RAYGUARD_FAULTS``
``PreflightError``                 preflight     a preflight check failed at worker start-up
``WorkerSetupError``               setup         device, env or NUMA set-up failed
``StateNotCheckpointableError``    checkpoint    ``report(state=)`` holds an unsaveable value
``UnsealableCheckpointError``      checkpoint    a reported directory holds a link or a FIFO
``ShardedStateError``              checkpoint    ``state=``/``sharded=`` misused
``FatalNonFiniteMetricError``      nan           NaN/inf with ``nan_policy="fail"``
``UnmatchedReportError``           hang          a rank reports after all others returned
=================================  ============  ==============================================

Every rayguard exception a restart cannot fix is defined in :mod:`rayguard.exceptions` and
named here. A class defined elsewhere (a user's own error) may join the table by setting
``fatal = True``, the one mechanism besides it.
"""

from __future__ import annotations

from rayguard.exceptions import (
    CheckpointError,
    ConfigError,
    FatalNonFiniteMetricError,
    NonFiniteMetricError,
    PreflightError,
    SerializationError,
    ShardedStateError,
    StateNotCheckpointableError,
    UnmatchedReportError,
    UnsealableCheckpointError,
    WorkerSetupError,
)

RETRIED = "retried"
NOT_RETRIED = "not_retried"
AFTER_ONE_REPEAT = "after_one_repeat"
RETRY_POLICIES = (RETRIED, AFTER_ONE_REPEAT, NOT_RETRIED)

FATAL_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (ConfigError, "config"),
    (PreflightError, "preflight"),
    (WorkerSetupError, "setup"),
    (StateNotCheckpointableError, "checkpoint"),
    (ShardedStateError, "checkpoint"),
    (UnsealableCheckpointError, "checkpoint"),
    (FatalNonFiniteMetricError, "nan"),
    (UnmatchedReportError, "hang"),
)
"""``(exception type, cause)`` of every rayguard exception a restart cannot fix."""

FATAL_ERRORS: tuple[type[BaseException], ...] = tuple(t for t, _ in FATAL_TYPES)

FATAL_BY_ATTRIBUTE: tuple[str, ...] = ()
"""rayguard's fatal classes defined outside :mod:`rayguard.exceptions` (``fatal = True``):
none since 0.2 (0.1 had two in ``rayguard.train``)."""

_ATTRIBUTE_CAUSES: tuple[tuple[type[BaseException], str], ...] = (
    (NonFiniteMetricError, "nan"),
    (CheckpointError, "checkpoint"),
    (SerializationError, "checkpoint"),
)


def fatal_cause(error: BaseException) -> str | None:
    """The cause of ``error`` when a restart cannot fix it (a type of :data:`FATAL_TYPES`,
    or a class that sets ``fatal = True``), else ``None``: retry it."""
    for cls, cause in FATAL_TYPES:
        if isinstance(error, cls):
            return cause
    if not getattr(error, "fatal", False):
        return None
    return next((cause for cls, cause in _ATTRIBUTE_CAUSES if isinstance(error, cls)), "error")
