"""Divergence of a training run's loss, acted on in a worker at each report.

``HealthConfig(divergence=DivergenceConfig())`` turns it on (off by default). Each rank keeps
the series of its first watched metric (``HealthConfig.watch_metrics``, or
``DivergenceConfig.metric``) over its own reports; a report whose value is beyond
``factor`` x both the series' best and its rolling median (the rule of a sweep's
divergence check, :func:`rayguard.health.series.check_divergence`, one rule for both) has
diverged. The worker then does what a NaN does (:mod:`rayguard.health.finite`): records
``diverged``, and either every rank rolls back in place (``GuardConfig(recovery="live")``,
:mod:`rayguard.train.rollback`) or the group restarts from the last verified checkpoint
(:class:`~rayguard.exceptions.DivergedMetricError`).

**The data is skipped.** A replay of the same batches from the same checkpoint diverges
again, bit for bit. So the step a run diverged at is kept at the run's coordinator, and
when a rank restores a checkpoint from before it, :func:`plan_skip` says how many optimizer
steps of data to leave out: those from the checkpoint to the divergence, the spike's own
batch included. :class:`~rayguard.elastic.ElasticSampler` takes them in its
``load_state_dict`` (:func:`take_data_skip`); a loop with its own data order reads
``rayguard.train.get_context().data_skip_steps`` and skips as many itself. A loop that skips
nothing diverges again at the same step, and the crash-loop rule ends the run after
``HealthConfig(crash_loop_retries)`` repeats, naming the step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from rayguard import runtime
from rayguard.exceptions import config_error, strict_fields

DIVERGED_KEY = "diverged"
"""Coordinator key: the latest step the run diverged at (``{"step", "value"}``)."""


@strict_fields
@dataclass(frozen=True)
class DivergenceConfig:
    """When a training run's loss has diverged (``HealthConfig(divergence=...)``)."""

    factor: float = 10.0
    """A value beyond this many times both the best so far and the rolling median has
    diverged (``mode="max"``: below best / factor)."""

    window: int = 20
    """Reports in the rolling median."""

    min_reports: int = 5
    """Reports a rank must have made (this process) before it judges one."""

    mode: Literal["min", "max"] = "min"
    """``"min"``: lower is better (a loss)."""

    metric: str | None = None
    """The metric judged; ``None``: the first of ``HealthConfig.watch_metrics`` that the
    report has."""

    skip_data: bool = True
    """After the rollback, leave out the data from the checkpoint to the divergence (see the
    module docstring). ``False``: replay it as it is (a loop whose divergence came from
    something other than its data)."""

    def __post_init__(self) -> None:
        f = self.factor
        if not (isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f)
                and f > 1):
            raise config_error("DivergenceConfig", "factor", f, "must be a number > 1",
                               "pass e.g. factor=10.0")
        for name in ("window", "min_reports"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 2):
                raise config_error("DivergenceConfig", name, value, "must be an int >= 2",
                                   f"pass e.g. {name}=5")
        if self.mode not in ("min", "max"):
            raise config_error("DivergenceConfig", "mode", self.mode, 'must be "min" or "max"',
                               'pass mode="min" for a loss')
        if self.metric is not None and not (isinstance(self.metric, str) and self.metric):
            raise config_error("DivergenceConfig", "metric", self.metric,
                               "must be a metric name or None", 'pass e.g. metric="loss"')
        if not isinstance(self.skip_data, bool):
            raise config_error("DivergenceConfig", "skip_data", self.skip_data,
                               "must be True or False", "pass skip_data=True")


@dataclass(frozen=True)
class _Rules:
    """A :class:`DivergenceConfig` as the series check reads it."""

    divergence_factor: float
    window: int
    min_results: int
    mode: str


class DivergenceWatch:
    """One rank's series of its judged metric (this process: it outlives in-place
    rollbacks, not restarts)."""

    def __init__(self, config: DivergenceConfig, watch_metrics: tuple[str, ...]) -> None:
        self.config = config
        self.names = (config.metric,) if config.metric else watch_metrics
        self._rules = _Rules(config.factor, config.window, config.min_reports, config.mode)
        self._history: deque[Any] = deque(maxlen=config.window)
        self._best: float | None = None

    def check(self, metrics: dict[str, Any], step: int) -> str | None:
        """The reason this report diverged (``None``: it did not; a NaN is the NaN guard's).
        A diverged value does not join the series."""
        from rayguard.health.checks import Point, is_nonfinite
        from rayguard.health.series import check_divergence

        name = next((n for n in self.names if _number(metrics.get(n))), None)
        if name is None or is_nonfinite(metrics[name]):
            return None
        point = Point(step, 0.0, {name: float(metrics[name])})
        history = [p for p in self._history if name in p.metrics]
        verdict = check_divergence("", history, point, self._rules,  # type: ignore[arg-type]
                                   0.0, self._best, metric=name)
        if verdict is not None:
            return (f"metric {name!r} diverged at step {step}: {verdict.value:.6g} is beyond "
                    f"{self.config.factor}x this rank's best and rolling median "
                    f"(threshold {verdict.threshold:.6g})")
        self._history.append(point)
        value = point.metrics[name]
        pick = min if self.config.mode == "min" else max
        self._best = value if self._best is None else pick(self._best, value)
        return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plan_skip(restored_step: int | None, diverged_step: int | None) -> int:
    """Optimizer steps of data to leave out after restoring the checkpoint of
    ``restored_step``: those up to and including ``diverged_step`` when the checkpoint is
    from before it, else none."""
    if restored_step is None or diverged_step is None or diverged_step <= restored_step:
        return 0
    return diverged_step - restored_step


def offer_data_skip(steps: int) -> None:
    """This rank's restore leaves out ``steps`` optimizer steps of data (set by
    ``load_state()``; 0: none; held by the worker's :mod:`rayguard.runtime`)."""
    runtime.current().pending_data_skip = max(0, int(steps))


def take_data_skip() -> int:
    """The steps of data the next sampler restore leaves out, once (``ElasticSampler``)."""
    rt = runtime.current()
    steps, rt.pending_data_skip = rt.pending_data_skip, 0
    return steps


__all__ = ["DIVERGED_KEY", "DivergenceConfig", "DivergenceWatch", "offer_data_skip",
           "plan_skip", "take_data_skip"]
