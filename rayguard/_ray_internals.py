"""Ray internals rayguard's console handling relies on (kept apart so that they are easy
to find and to check against a new Ray)."""

from __future__ import annotations

import logging


def train_context_logger() -> logging.Logger:
    """The logger of Ray Train's worker context module, which logs every report at INFO.
    Ray 2.60 names it by the module's file path."""
    from ray.train.v2._internal.execution import context

    return logging.getLogger(getattr(context, "logger", logging.getLogger(context.__file__)).name)
