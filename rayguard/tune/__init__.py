"""rayguard.tune: non-blocking Ray Tune sweeps whose unhealthy trials restart themselves.

``run(...)`` starts a sweep and returns a :class:`TuneRun` handle at once;
:class:`HealthCallback` is the ``ray.tune.Callback`` doing the watching (usable on its own
with a plain ``Tuner``); :class:`SweepHealthConfig` holds the settings of the checks only a
sweep runs (divergence, throughput collapse, memory growth).
"""

from rayguard.health.checks import Verdict
from rayguard.health.sweep_config import SweepHealthConfig
from rayguard.tune.callback import HealthCallback, TrialStatus
from rayguard.tune.events import SweepEvent, read
from rayguard.tune.handle import SweepNotDoneError, TuneRun
from rayguard.tune.run import run

__all__ = ["HealthCallback", "SweepEvent", "SweepHealthConfig", "SweepNotDoneError",
           "TrialStatus", "TuneRun", "Verdict", "read", "run"]
