"""Why a worker failed, named once: :func:`classify` turns a worker's exception (and the
mark it left with the run's coordinator) into a :class:`Failure` (cause, one-line reason,
fatal or not, retry policy). The controller writes it into the ``worker_died`` event;
the report, the timeline and the metrics read it from there. Which exceptions are never
retried is listed in one table, :mod:`rayguard.failures.fatal`. See
``docs/failure-handling.md``. Pure: no Ray import.
"""

from rayguard.failures.fatal import (
    AFTER_ONE_REPEAT,
    FATAL_ERRORS,
    NOT_RETRIED,
    RETRIED,
    RETRY_POLICIES,
    fatal_cause,
)
from rayguard.failures.taxonomy import CAUSES, Failure, classify, most_severe

__all__ = ["AFTER_ONE_REPEAT", "CAUSES", "FATAL_ERRORS", "NOT_RETRIED", "RETRIED",
           "RETRY_POLICIES", "Failure", "classify", "fatal_cause", "most_severe"]
