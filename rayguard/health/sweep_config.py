"""SweepHealthConfig: the checks only a sweep runs, over each trial's series of results.

A training run (``RobustTrainer``) watches progress and finite metrics per step
(:class:`~rayguard.HealthConfig`); a sweep (``rayguard.tune.run``) also judges each trial's
series of results: divergence, throughput collapse, memory growth. Their settings live here,
and only here (``HealthConfig`` names this class when given one of them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from rayguard.exceptions import config_error, strict_fields

Mode = Literal["min", "max"]


@strict_fields
@dataclass(frozen=True)
class SweepHealthConfig:
    """Series checks of a sweep (``rayguard.tune.run(sweep_health=...)``); each check judges
    a trial against its own history."""

    mode: Mode = "min"
    """Whether the first watched metric is minimised or maximised (for divergence)."""

    divergence_factor: float | None = 10.0
    """Diverged when the first watched metric is worse than this factor times the trial's own
    best and its rolling median (``None`` turns the check off)."""

    window: int = 20
    """Results in the rolling windows (median, throughput median, memory trend)."""

    min_results: int = 5
    """Results a trial must have reported before divergence/throughput/memory are judged."""

    throughput_collapse_fraction: float | None = 0.1
    """Collapsed when results per second fall below this fraction of the trial's own median
    (``None`` turns the check off)."""

    memory_metrics: tuple[str, ...] = ("memory_bytes", "gpu_memory_bytes")
    """Reported metrics holding host/GPU memory in bytes, watched for steady growth."""

    memory_growth_fraction: float | None = 0.5
    """Memory growth: the metric rose at every one of the last ``window`` results and by more
    than this fraction in total (``None`` turns the check off)."""

    def __post_init__(self) -> None:
        check_sweep_fields(self, "SweepHealthConfig")


SWEEP_FIELDS = tuple(f.name for f in fields(SweepHealthConfig))
"""The settings only a sweep uses (``HealthConfig`` rejects them, naming this config)."""


def check_sweep_fields(config: Any, owner: str) -> None:
    """Validate (and normalise ``memory_metrics`` of) ``config``'s sweep fields; errors name
    ``owner``, the field, the value and the fix."""
    if isinstance(config.memory_metrics, (list, str)):
        value = config.memory_metrics
        object.__setattr__(config, "memory_metrics",
                           (value,) if isinstance(value, str) else tuple(value))
    if config.mode not in ("min", "max"):
        raise config_error(owner, "mode", config.mode, 'must be "min" or "max"',
                           'pass mode="min" for a loss')
    for name in ("window", "min_results"):
        value = getattr(config, name)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 2):
            raise config_error(owner, name, value, "must be an int >= 2", f"pass e.g. {name}=20")
    for name, lo, hi in (("divergence_factor", 1.0, float("inf")),
                         ("throughput_collapse_fraction", 0.0, 1.0),
                         ("memory_growth_fraction", 0.0, float("inf"))):
        value = getattr(config, name)
        if value is not None and not (isinstance(value, (int, float)) and lo < value <= hi):
            raise config_error(owner, name, value, f"must be in ({lo}, {hi}] or None",
                               f"pass a value in that range, or {name}=None to turn it off")
    if not all(isinstance(m, str) and m for m in config.memory_metrics):
        raise config_error(owner, "memory_metrics", config.memory_metrics,
                           "must be metric names", 'pass e.g. memory_metrics=("memory_bytes",)')


def resolve_sweep_health(sweep_health: SweepHealthConfig | None,
                         owner: str) -> SweepHealthConfig:
    """The sweep settings in force: ``sweep_health``, or the defaults when it is ``None``."""
    if sweep_health is None:
        return SweepHealthConfig()
    if not isinstance(sweep_health, SweepHealthConfig):
        raise config_error(owner, "sweep_health", sweep_health,
                           "must be a rayguard.tune.SweepHealthConfig",
                           "pass sweep_health=rayguard.tune.SweepHealthConfig(...)")
    return sweep_health
