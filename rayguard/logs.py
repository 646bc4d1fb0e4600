"""rayguard's console output: its own logger's level and handler, and Ray's per-report chatter.

``RAYGUARD_LOG_LEVEL`` (default ``INFO``) sets the level of the ``rayguard`` logger in the
driver and in every worker (it is propagated). Routine facts (each checkpoint, each report,
the NUMA binding of each worker) are logged at ``DEBUG``; what a person must see (a restart,
a stall, a rejected checkpoint, a resize) at ``WARNING``; the driver's progress line at
``INFO``.
"""

from __future__ import annotations

import logging

from rayguard.constants import DEFAULT_LOG_LEVEL, LOG_LEVEL_ENV_VAR, env_str

LOGGER_NAME = "rayguard"


def log_level() -> int:
    """The level named by ``RAYGUARD_LOG_LEVEL``; an unknown name falls back to INFO with a
    warning that names the variable."""
    raw = env_str(LOG_LEVEL_ENV_VAR, DEFAULT_LOG_LEVEL).strip().upper()
    level = logging.getLevelName(raw)
    if isinstance(level, int):
        return level
    logging.getLogger(LOGGER_NAME).warning(
        "%s=%r is not a log level; using INFO. Fix: set it to DEBUG, INFO, WARNING or ERROR.",
        LOG_LEVEL_ENV_VAR, raw)
    return logging.INFO


def configure_logging() -> logging.Logger:
    """Set the ``rayguard`` logger's level from the environment and, when nothing in the
    process handles its records yet, give it one stderr handler (``[rayguard] message``)."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(log_level())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[rayguard] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    return logger


class _DropPerReportLines(logging.Filter):
    """Ray Train logs one INFO line per ``ray.train.report`` ("Reporting training result N:
    TrainingReport(...)"); rayguard forwards every report, so that is one line per step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Reporting training result")


def quiet_ray_reports() -> None:
    """In a worker: drop Ray's per-report INFO line unless ``RAYGUARD_LOG_LEVEL=DEBUG``."""
    if log_level() <= logging.DEBUG:
        return
    from rayguard._ray.core import train_context_logger

    target = train_context_logger()
    if not any(isinstance(f, _DropPerReportLines) for f in target.filters):
        target.addFilter(_DropPerReportLines())
