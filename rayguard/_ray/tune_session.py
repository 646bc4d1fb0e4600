"""The Tune trial's side of a Train run inside it: the run's last reports reach the trial.

Ray Train hands a run's reports to the Tune trial it runs in through a queue actor
(``TuneReportCallback`` puts each one; the trial's ``_TrainSession`` holds the queue as
``_inter_actor_queue``). The trial's main thread moves a report from that queue into its own
``result_queue`` only when Tune asks it for the next result. When the training function
returns first, Tune's function wrapper puts its end marker (``RESULT_DUPLICATE``) into
``result_queue`` before that report: the trial ends and the run's last report is never
logged (Tune's last result then says an earlier step; Ray 2.59 and 2.60,
``_TrainSession.get_next`` / ``_get_result_from_queues``). A ``fit()`` inside a trial
therefore waits, bounded, until the trial has taken every report before it returns
(:func:`drain_train_reports`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger("rayguard")

DRAIN_TIMEOUT_S = 10.0
"""How long a ``fit()`` inside a Tune trial waits for the trial to take the run's reports."""

SETTLED_POLLS = 3
"""Consecutive polls that must find both queues empty: a report between the two (taken from
the queue actor, not yet in ``result_queue``) is in flight for a remote call's return."""


def tune_session() -> Any:
    """The Tune trial's session of this process (``None``: not in a trial)."""
    try:
        from ray.train._internal.session import get_session

        return get_session()
    except Exception:  # a Ray without it: nothing to wait for
        return None


def drain_train_reports(session: Any = None, timeout_s: float = DRAIN_TIMEOUT_S,
                        poll_s: float = 0.05) -> bool:
    """Wait until the Tune trial of this process has taken every report the Train run sent
    it (its queue actor and its result queue both empty, :data:`SETTLED_POLLS` polls in a
    row). ``True`` when they were, or when there is nothing to wait for (not in a trial, no
    ``TuneReportCallback``, the queue actor gone); ``False`` after ``timeout_s``."""
    session = tune_session() if session is None else session
    reports = getattr(session, "_inter_actor_queue", None)
    if reports is None:
        return True
    results = getattr(session, "result_queue", None)
    deadline, settled = time.monotonic() + timeout_s, 0
    while True:
        try:
            empty = reports.empty() and (results is None or results.empty())
        except Exception as exc:  # the queue actor is gone: no report can still come
            logger.debug("rayguard: the trial's report queue is gone: %s", exc)
            return True
        settled = settled + 1 if empty else 0
        if settled >= SETTLED_POLLS:
            return True
        if time.monotonic() >= deadline:
            logger.warning("rayguard: the Tune trial did not take the run's last report "
                           "within %.0f s; its last result may be an earlier one", timeout_s)
            return False
        time.sleep(poll_s)


__all__ = ["DRAIN_TIMEOUT_S", "SETTLED_POLLS", "drain_train_reports", "tune_session"]
