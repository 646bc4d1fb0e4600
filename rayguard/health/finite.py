"""NaN/inf in the watched metrics, acted on in a worker at each report.

:func:`~rayguard.health.decisions.check_finite` decides; :class:`FiniteGuard` records
``nan_detected`` (waited for: the worker is about to fail), lets the reports before this
one reach Ray Train, and raises: :class:`~rayguard.exceptions.NonFiniteMetricError` (the
group restarts from the last verified checkpoint before it) or, with ``nan_policy="fail"``,
:class:`~rayguard.exceptions.FatalNonFiniteMetricError` (the run ends). No import of
:mod:`rayguard.train`: the link and the flush are passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayguard.exceptions import (
    DivergedMetricError,
    FatalNonFiniteMetricError,
    NonFiniteMetricError,
)
from rayguard.health.config import HealthConfig
from rayguard.health.decisions import check_finite
from rayguard.health.divergence import DIVERGED_KEY, DivergenceWatch
from rayguard.health.recovery import RESTART, ROLLBACK


class FiniteGuard:
    """``link``: a :class:`~rayguard.run.link.RunLink` (the event, the worker's place);
    ``flush``: hands the reports already made to Ray Train (never raises)."""

    def __init__(self, health: HealthConfig, link: Any, flush: Callable[[], None]) -> None:
        self.health = health
        self.link = link
        self.flush = flush
        self.divergence = None if health.divergence is None else DivergenceWatch(
            health.divergence, health.watch_metrics)

    def check(self, metrics: dict[str, Any], step: int, *, defer: bool = False) -> bool:
        """Raise when a watched metric of this report is NaN or inf. ``defer``: with
        ``nan_policy="restart"``, return True instead (the caller rolls every rank back in
        place, ``GuardConfig(recovery="live")``); False when every metric is finite."""
        health = self.health
        decision = check_finite(metrics, health.watch_metrics, policy=health.nan_policy,
                                step=step)
        if decision.ok:
            return self._check_divergence(metrics, step, defer=defer)
        deferred = defer and decision.action != "fail"
        self.link.record("nan_detected", f"{decision.reason}; policy {health.nan_policy}"
                         + (" (every rank rolls back in place)" if deferred else ""),
                         step=step, wait=True, value=str(decision.value),
                         path=(ROLLBACK if deferred else RESTART).value)
        if deferred:
            return True
        self.flush()
        cls = FatalNonFiniteMetricError if decision.action == "fail" else NonFiniteMetricError
        what = ("the run ends (nan_policy='fail')" if decision.action == "fail" else
                "this attempt stops (the group resumes from the last verified checkpoint "
                "before it unless the restart budget or the crash-loop rule ends the run)")
        ctx = self.link.ctx
        raise cls(f"rank {ctx.rank} on node {ctx.node_id[:8]}: {decision.reason}; {what}. "
                  "Fix: lower the learning rate, clip gradients, or check the data at that step.")

    def _check_divergence(self, metrics: dict[str, Any], step: int, *, defer: bool) -> bool:
        """A finite report judged for divergence (``HealthConfig(divergence=...)``): as a
        NaN, ``diverged`` is recorded, then True (``defer``) or a raise; the step is kept at
        the run's coordinator so that the restore leaves out the data that diverged."""
        if self.divergence is None:
            return False
        reason = self.divergence.check(metrics, step)
        if reason is None:
            return False
        health = self.health
        fail = health.nan_policy == "fail"
        deferred = defer and not fail
        self.link.mark(DIVERGED_KEY, {"step": step})  # waited for: read after a restart
        self.link.record("diverged", f"{reason}; policy {health.nan_policy}"
                         + (" (every rank rolls back in place)" if deferred else ""),
                         step=step, wait=True, path=(ROLLBACK if deferred else RESTART).value,
                         skip_data=self.divergence.config.skip_data)
        if deferred:
            return True
        self.flush()
        ctx = self.link.ctx
        what = ("the run ends (nan_policy='fail')" if fail else
                "this attempt stops (the group resumes from the last verified checkpoint "
                "before it unless the restart budget or the crash-loop rule ends the run)")
        cls = FatalNonFiniteMetricError if fail else DivergedMetricError
        raise cls(f"rank {ctx.rank} on node {ctx.node_id[:8]}: {reason}; {what}. Fix: lower the "
                  "learning rate, clip gradients, or check the data at that step.")
