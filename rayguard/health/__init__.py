"""Health of runs and sweeps, one package.

Pure: :mod:`~rayguard.health.checks` (checks over one observation: non-finite metrics,
stall), :mod:`~rayguard.health.series` (checks over a trial's series: divergence,
throughput collapse, memory growth), :mod:`~rayguard.health.decisions` (the one
``Decision`` type), :mod:`~rayguard.health.crash_loop`; configs
:mod:`~rayguard.health.config` (``HealthConfig``) and :mod:`~rayguard.health.sweep_config`
(``SweepHealthConfig``). Executors, one per host: a worker's watchdog, stall responder and NaN guard
(:mod:`~rayguard.health.watchdog`, :mod:`~rayguard.health.stall`,
:mod:`~rayguard.health.finite`: kill or raise; its divergence watch
:mod:`~rayguard.health.divergence`) and a sweep's
:mod:`rayguard._ray.tune` (restart or fail the trial).
"""

from rayguard.health.config import HealthConfig
from rayguard.health.divergence import DivergenceConfig
from rayguard.health.sweep_config import SweepHealthConfig

__all__ = ["DivergenceConfig", "HealthConfig", "SweepHealthConfig"]
