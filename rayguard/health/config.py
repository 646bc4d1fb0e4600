"""HealthConfig: what the progress watchdog, the NaN guard and the stall/NaN checks of a sweep watch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rayguard.exceptions import config_error, moved_fields, strict_fields
from rayguard.health.divergence import DivergenceConfig
from rayguard.health.sweep_config import SWEEP_FIELDS

NanPolicy = Literal["restart", "fail"]


@moved_fields(SWEEP_FIELDS, "rayguard.tune.SweepHealthConfig",
              "leave them out of HealthConfig; for a sweep pass "
              "rayguard.tune.run(..., sweep_health={call})")
@strict_fields
@dataclass(frozen=True)
class HealthConfig:
    """Health checks of a training run (``GuardConfig(health=...)``) or a sweep
    (``rayguard.tune.run(health=...)``). A sweep's series checks (divergence, throughput,
    memory) have their own config, :class:`~rayguard.tune.SweepHealthConfig`."""

    stall_timeout_s: float | None = None
    """Seconds without progress (a ``report`` or ``heartbeat``) after which a rank is stuck.
    ``None``: adaptive, ``stall_timeout_multiplier`` x the slowest step seen so far, never
    below ``stall_timeout_floor_s``."""

    stall_timeout_multiplier: float = 10.0
    """Adaptive stall timeout: this many times the slowest step seen so far."""

    stall_timeout_floor_s: float = 300.0
    """Adaptive stall timeout never goes below this."""

    startup_timeout_s: float = 1800.0
    """Seconds a rank may take from its start (set-up, ``load_state()``, CUDA/NCCL init,
    ``torch.compile``, data-loader warm-up) to its first completed step. The stall timeout
    applies only from the first step on; before it, this bound does (every restart starts
    again with it)."""

    diagnosis_wait_s: float = 5.0
    """When a rank's watchdog fires, how long the run waits for every rank's answer to the
    hang diagnosis (its collectives and stacks) before deciding with the answers it has;
    a rank that has not answered by then is named as a culprit. Detection takes the
    stall bound plus at most this (live ranks answer within about a second)."""

    live_wait_s: float = 30.0
    """``GuardConfig(recovery="live")``: how long a surviving rank waits for the run to say
    that a peer was lost (and then for the replacement to join: this plus Ray Train's
    worker-group start timeout, since a replacement may be a new process) before it gives up
    and the whole worker group restarts instead. An elastic resize in place bounds its
    steps by it: the kept workers leaving their attempt, the group placed (a kept worker
    waits for its new place twice this, and for a grow also Ray Train's worker-group start
    timeout)."""

    live_spare: bool = True
    """``GuardConfig(recovery="live")``: keep one warm spare worker process on each node of
    the run (an idle Ray worker with torch imported, a few hundred MB of host memory), so
    that a replacement starts in it at once instead of in a new process
    (:mod:`rayguard._ray.spare`). ``False``: no spare."""

    live_spare_after_s: float = 60.0
    """How long after an attempt's set-up a node's spare is started: its start (a process
    importing torch and what the workers imported) then never competes with the workers'
    own start and first steps, nor costs a run that ends or fails in its first minute.
    A failure before then starts its replacement in a new process. ``0``: at once."""

    crash_loop_retries: int = 1
    """Restarts allowed for a failure that repeats: the same exception from the same frame on
    the same rank ending consecutive attempts with no checkpoint committed in between (or at
    the same step). After that many repeats the run ends with the user's exception. ``0``:
    an exception raised by the training function is never retried (deaths and hangs still
    are)."""

    watch_metrics: tuple[str, ...] = ("loss", "train_loss", "eval_loss")
    """Reported metrics that must stay finite (NaN/inf triggers ``nan_policy``), in
    ``rayguard.train.report`` and ``ray.train.report`` alike. The default covers the names
    Transformers' ``Trainer`` logs (``loss``, ``train_loss``, ``eval_loss``) and the usual
    Lightning ones; add your own logged names (``"val_loss"``). ``()``: no NaN check."""

    nan_policy: NanPolicy = "restart"
    """On NaN/inf: ``"restart"`` from the last verified checkpoint before the bad value, or
    ``"fail"`` the run at once with a clear message."""

    divergence: DivergenceConfig | None = None
    """Judge the loss for divergence at every report (:mod:`rayguard.health.divergence`): a
    value beyond ``factor`` x this rank's best and rolling median does what a NaN does
    (``nan_policy``), and the rollback leaves out the data that diverged. ``None`` (default):
    no divergence check. Sweeps have their own (``SweepHealthConfig.divergence_factor``)."""

    max_restarts: int = 3
    """Restarts allowed (health restarts; also Ray's ``max_failures`` when the user gave no
    ``FailureConfig``)."""

    # -- step timing and stragglers (rayguard.observe) ----------------------------------------
    step_summary_interval_s: float = 5.0
    """Each rank sends its step-time summary to the run's coordinator at most this often
    (fire-and-forget; nothing is sent per report). Also the resolution of the steps/s and
    loss curves in ``rayguard report``."""

    straggler_threshold: float | None = 1.5
    """A rank whose mean step time over ``straggler_window_s`` is at least this many times
    its peers' median is reported as a ``straggler``. 1.5: a synchronous job runs at its
    slowest rank's pace, so such a rank costs a third of the throughput, while GC pauses,
    data-loader jitter and checkpoint writes move a one-minute mean by a few percent.
    ``None`` turns detection off (timings are still sent and exported)."""

    straggler_window_s: float = 60.0
    """Seconds of step times compared (a sliding window); a rank must have been observed for
    a whole window before it can be flagged, so one slow step or a slow start never is.
    Must be >= ``step_summary_interval_s``."""

    # -- bad nodes (rayguard.health.quarantine) -----------------------------------------------
    quarantine_after: int | None = 2
    """A node on which workers die (killed by the OS, out of memory, a CUDA/NCCL error, a
    failed preflight, a diagnosed hang's culprit) in this many attempts of a run (counted per
    attempt, not per worker) is quarantined: later worker groups are placed on the other
    nodes (``docs/fault-tolerance.md``). ``None``: never quarantine. Lift one with
    ``rayguard quarantine lift RUN_DIR NODE``."""

    straggler_evict_after_s: float | None = None
    """Elastic runs only (``ScalingConfig(num_workers=(min, max))``): a rank flagged as a
    straggler (``straggler_threshold``) for this many seconds without a break has its node
    quarantined, so the next resize leaves it out. ``None`` (default): stragglers are only
    reported."""

    def __post_init__(self) -> None:
        value = self.watch_metrics
        if isinstance(value, (list, str)):
            object.__setattr__(self, "watch_metrics",
                               (value,) if isinstance(value, str) else tuple(value))
        if self.stall_timeout_s is not None and not (
            isinstance(self.stall_timeout_s, (int, float)) and self.stall_timeout_s > 0
            and math.isfinite(self.stall_timeout_s)
        ):
            raise config_error("HealthConfig", "stall_timeout_s", self.stall_timeout_s,
                               "must be a finite number of seconds > 0",
                               "pass e.g. stall_timeout_s=60, or None for the adaptive timeout")
        if not (isinstance(self.stall_timeout_multiplier, (int, float))
                and self.stall_timeout_multiplier >= 1):
            raise config_error("HealthConfig", "stall_timeout_multiplier",
                               self.stall_timeout_multiplier, "must be >= 1",
                               "use a generous multiple such as 10")
        if not (isinstance(self.stall_timeout_floor_s, (int, float)) and self.stall_timeout_floor_s > 0):
            raise config_error("HealthConfig", "stall_timeout_floor_s", self.stall_timeout_floor_s,
                               "must be > 0", "use a floor that covers start-up, e.g. 300")
        if not (isinstance(self.startup_timeout_s, (int, float)) and self.startup_timeout_s > 0
                and math.isfinite(self.startup_timeout_s)):
            raise config_error("HealthConfig", "startup_timeout_s", self.startup_timeout_s,
                               "must be a finite number of seconds > 0",
                               "pass a bound that covers start-up and the first step, e.g. 1800")
        if not (isinstance(self.diagnosis_wait_s, (int, float))
                and not isinstance(self.diagnosis_wait_s, bool)
                and 0 < self.diagnosis_wait_s <= 600 and math.isfinite(self.diagnosis_wait_s)):
            raise config_error("HealthConfig", "diagnosis_wait_s", self.diagnosis_wait_s,
                               "must be a number of seconds in (0, 600]",
                               "pass e.g. diagnosis_wait_s=5")
        if not (isinstance(self.live_wait_s, (int, float))
                and not isinstance(self.live_wait_s, bool)
                and 0 < self.live_wait_s <= 3600 and math.isfinite(self.live_wait_s)):
            raise config_error("HealthConfig", "live_wait_s", self.live_wait_s,
                               "must be a number of seconds in (0, 3600]",
                               "pass e.g. live_wait_s=30")
        if not isinstance(self.live_spare, bool):
            raise config_error("HealthConfig", "live_spare", self.live_spare,
                               "must be True or False", "pass live_spare=False to keep none")
        if not (isinstance(self.live_spare_after_s, (int, float))
                and not isinstance(self.live_spare_after_s, bool)
                and 0 <= self.live_spare_after_s <= 3600
                and math.isfinite(self.live_spare_after_s)):
            raise config_error("HealthConfig", "live_spare_after_s", self.live_spare_after_s,
                               "must be a number of seconds in [0, 3600]",
                               "pass e.g. live_spare_after_s=60 (0: at once)")
        if not (isinstance(self.crash_loop_retries, int)
                and not isinstance(self.crash_loop_retries, bool) and self.crash_loop_retries >= 0):
            raise config_error("HealthConfig", "crash_loop_retries", self.crash_loop_retries,
                               "must be an int >= 0", "pass e.g. crash_loop_retries=1")
        if not all(isinstance(m, str) and m for m in self.watch_metrics):
            raise config_error("HealthConfig", "watch_metrics", self.watch_metrics,
                               "must be metric names (non-empty strings)",
                               'pass e.g. watch_metrics=("loss",)')
        if self.nan_policy not in ("restart", "fail"):
            raise config_error("HealthConfig", "nan_policy", self.nan_policy,
                               'must be "restart" or "fail"', 'pass nan_policy="restart"')
        if self.divergence is not None and not isinstance(self.divergence, DivergenceConfig):
            raise config_error("HealthConfig", "divergence", self.divergence,
                               "must be a rayguard.DivergenceConfig or None",
                               "pass divergence=rayguard.DivergenceConfig(factor=10.0)")
        if not (isinstance(self.max_restarts, int) and not isinstance(self.max_restarts, bool)
                and self.max_restarts >= 0):
            raise config_error("HealthConfig", "max_restarts", self.max_restarts,
                               "must be an int >= 0", "pass e.g. max_restarts=3")

        self._check_timing_fields()
        self._check_quarantine_fields()

    def _check_quarantine_fields(self) -> None:
        after = self.quarantine_after
        if after is not None and not (isinstance(after, int) and not isinstance(after, bool)
                                      and after >= 1):
            raise config_error("HealthConfig", "quarantine_after", after,
                               "must be an int >= 1 (attempts with a failure on the node) or None",
                               "pass e.g. quarantine_after=2, or None to never quarantine a node")
        evict = self.straggler_evict_after_s
        if evict is not None and not (isinstance(evict, (int, float))
                                      and not isinstance(evict, bool)
                                      and evict >= 0 and math.isfinite(evict)):
            raise config_error("HealthConfig", "straggler_evict_after_s", evict,
                               "must be a finite number of seconds >= 0 or None",
                               "pass e.g. straggler_evict_after_s=300, or None to only report "
                               "stragglers")
        if evict is not None and self.straggler_threshold is None:
            raise config_error("HealthConfig", "straggler_evict_after_s", evict,
                               "needs straggler detection, but straggler_threshold=None",
                               "set straggler_threshold (e.g. 1.5) or leave "
                               "straggler_evict_after_s=None")
        if evict is not None and after is None:
            raise config_error("HealthConfig", "straggler_evict_after_s", evict,
                               "evicts through the quarantine, but quarantine_after=None",
                               "set quarantine_after (e.g. 2) or leave straggler_evict_after_s=None")

    def _check_timing_fields(self) -> None:
        for name in ("step_summary_interval_s", "straggler_window_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and value > 0 and math.isfinite(value)):
                raise config_error("HealthConfig", name, value, "must be a finite number of "
                                   "seconds > 0", f"pass e.g. {name}="
                                   f"{5.0 if name == 'step_summary_interval_s' else 60.0}")
        threshold = self.straggler_threshold
        if threshold is not None and not (isinstance(threshold, (int, float))
                                          and not isinstance(threshold, bool)
                                          and 1 < threshold < float("inf")):
            raise config_error("HealthConfig", "straggler_threshold", threshold,
                               "must be a ratio > 1 or None",
                               "pass e.g. straggler_threshold=1.5, or None to turn it off")
        if self.straggler_window_s < self.step_summary_interval_s:
            raise config_error("HealthConfig", "straggler_window_s", self.straggler_window_s,
                               f"must be >= step_summary_interval_s={self.step_summary_interval_s}"
                               " (the window must hold at least one summary of each rank)",
                               "use a window of several intervals, e.g. 60 with an interval of 5")

    def progress_bound(self, slowest_step_s: float | None, *, started: bool) -> tuple[str, float]:
        """The bound in force: ``("startup", startup_timeout_s)`` before the first completed
        step of an attempt, ``("stall", timeout)`` after it. With the adaptive timeout and no
        step measured yet (one report so far), the stall bound is the larger of the floor and
        the start-up bound: a loop that reports only at a framework's saves or epoch ends
        (Transformers' ``save_steps``, Lightning's epochs) has steps of unknown length, and a
        healthy run must not be killed for a long first interval."""
        if not started:
            return "startup", float(self.startup_timeout_s)
        if slowest_step_s is None and self.stall_timeout_s is None:
            return "stall", max(self.stall_timeout_for(None), float(self.startup_timeout_s))
        return "stall", self.stall_timeout_for(slowest_step_s)

    def stall_timeout_for(self, slowest_step_s: float | None) -> float:
        """The stall timeout in force, given the slowest step seen so far."""
        if self.stall_timeout_s is not None:
            return float(self.stall_timeout_s)
        adaptive = (slowest_step_s or 0.0) * self.stall_timeout_multiplier
        return max(self.stall_timeout_floor_s, adaptive)
