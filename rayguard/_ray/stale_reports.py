"""A failed attempt's reports that reach Ray Train after live recovery began: dropped before
Ray pairs them.

Ray's report handler pairs the i-th report of every rank. Under live recovery a survivor
blocked in ``ray.train.report`` when its peer dies is released by the replacement's reset of
the group's barrier, after Ray cleared its result queue: its report of the failed attempt is
queued after the clear and would be paired with the replacement's first report, every later
result (``Result.metrics``, the checkpoint's metrics) one report behind. The same holds for a
resize in place. So each report a live run's worker makes carries the attempt it was made in
(:class:`rayguard._ray.report.AttemptTagged`), and :class:`StaleReports`, put first among the
controller's worker-group callbacks (before Ray's report handler), takes the tag off every
report and drops one made before the live attempt the group runs.

Relies on (Ray 2.59 and 2.60): the controller runs its worker-group callbacks in the order of
``TrainController._worker_group_callbacks_to_propagate``, Ray's report handler first; a poll
status's ``worker_statuses[i].training_report`` (``None``: no report) and its ``metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rayguard._ray import version_error
from rayguard._ray.report import ATTEMPT_TAG

try:
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
except ImportError as _exc:  # pragma: no cover - a Ray whose Train V2 internals moved
    raise version_error(f"a Train V2 internal ({_exc})", "live recovery") from _exc

logger = logging.getLogger("rayguard")

__all__ = ["StaleReports", "drop_stale"]


def drop_stale(statuses: dict[int, Any], floor: int) -> list[int]:
    """Take the attempt tag off each worker's report in ``statuses`` and drop (set to
    ``None``) a report tagged with an attempt before ``floor``; returns the ranks dropped.
    An untagged report (a worker not under live recovery) is kept as it is."""
    dropped = []
    for rank, status in statuses.items():
        report = getattr(status, "training_report", None)
        metrics = getattr(report, "metrics", None)
        if not isinstance(metrics, dict) or ATTEMPT_TAG not in metrics:
            continue
        tag = metrics.pop(ATTEMPT_TAG)
        if isinstance(tag, int) and tag < floor:
            status.training_report = None
            dropped.append(rank)
    return dropped


class StaleReports(WorkerGroupCallback):
    """The controller's filter of a failed attempt's reports (the module's docstring);
    ``floor()``: the live attempt the group runs (reports before it are stale; -1: none)."""

    def __init__(self, floor: Callable[[], int]) -> None:
        self.floor = floor

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        floor = self.floor()
        dropped = drop_stale(worker_group_status.worker_statuses, floor)
        if dropped:
            logger.debug("rayguard: report(s) of rank(s) %s made before attempt %s dropped "
                         "(the failed attempt's, released by the replacement)", dropped, floor)

