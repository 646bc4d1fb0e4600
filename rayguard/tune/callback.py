"""HealthCallback: a ``ray.tune.Callback`` that watches every trial and restarts the unhealthy
ones from their last good checkpoint.

All hooks run in the Tune driver's event loop (the thread that called ``Tuner.fit()``). The
callback feeds each result to the pure checks (:mod:`rayguard.health.checks`,
:mod:`rayguard.health.series`), turns verdicts
into decisions (:mod:`rayguard.tune.decisions`) and applies them at the start of the next
loop turn (:mod:`rayguard._ray.tune`), never in the middle of Tune's result handling.
A stall needs a timer, since a stalled trial reports nothing: ``on_step_begin``, which Tune
calls on every loop turn (at least every ~0.1 s), checks the time since each running
trial's last result.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from rayguard._ray import tune as executor
from rayguard.health.checks import NONFINITE, Point, Verdict, check_stall, numeric_metrics
from rayguard.health.config import HealthConfig
from rayguard.health.decisions import RESTART, CheckpointRecord, Decision
from rayguard.health.series import check_result, recent_count
from rayguard.health.sweep_config import SweepHealthConfig, resolve_sweep_health
from rayguard.tune import events as ev
from rayguard.tune.decisions import decide, rewind
from rayguard.tune.verify import checkpoint_is_good

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

CHECKPOINT_PATH_KEY = "checkpoint_path"


def reject_later_checkpoints(records: list[CheckpointRecord], chosen: CheckpointRecord | None,
                             reason: str) -> None:
    """A RobustTrainer inside the trial resumes from the newest *verified* checkpoint of its
    run: mark every checkpoint of that run newer than ``chosen`` (also those Tune has not
    seen yet) so that it resumes from ``chosen`` instead."""
    from rayguard.checkpoint.fallback import list_candidates
    from rayguard.checkpoint.rejections import reject

    roots = {os.path.dirname(r.path.rstrip("/")) for r in records if os.path.isdir(r.path)}
    limit = None
    if chosen is not None and os.path.isdir(chosen.path):
        limit = next((c for c in list_candidates(os.path.dirname(chosen.path.rstrip("/")))
                      if os.path.samefile(c.path, chosen.path)), None)
    for root in roots:
        for cand in list_candidates(root):
            newer = limit is None or (
                (cand.step, cand.mtime) > (limit.step, limit.mtime)
                if cand.step is not None and limit.step is not None else cand.mtime > limit.mtime)
            if newer:
                reject(cand.path, f"taken after the anomaly: {reason}")
"""Metric under which Ray Train inside a Tune trial reports its checkpoint's path."""
MAX_RECORDS = 64
"""Checkpoint records kept per trial (the newest)."""


@dataclass
class TrialHealth:
    """What the callback knows about one trial (driver-side, mutable)."""

    trial_id: str
    points: deque[Point]
    records: list[CheckpointRecord] = field(default_factory=list)
    restarts: int = 0
    best: float | None = None
    last_progress: float | None = None
    """``time.monotonic()`` of the last result or start; ``None`` while not running."""
    last_iteration: int = 0
    started: bool = False
    """A result arrived since the trial (re)started: the stall timeout applies, not the
    start-up bound."""
    slowest_step_s: float | None = None
    verdict: Verdict | None = None
    pending: Decision | None = None


@dataclass(frozen=True)
class TrialStatus:
    """One trial as :meth:`TuneRun.status` shows it."""

    trial_id: str
    state: str
    """Tune's status: PENDING, RUNNING, PAUSED, TERMINATED or ERROR."""
    last_metrics: dict[str, Any]
    restarts: int
    """Health restarts so far."""
    verdict: Verdict | None
    """The last unhealthy verdict (``None``: never unhealthy)."""
    checkpoint_iteration: int | None
    """Iteration of the newest checkpoint reported."""


class HealthCallback(Callback):
    """Watch each trial of a sweep; restart unhealthy ones from their last good checkpoint.

    Usable on its own: ``Tuner(..., run_config=RunConfig(callbacks=[HealthCallback(h)]))``.
    ``sweep_health``: the series checks' settings (default: ``SweepHealthConfig()``).
    """

    def __init__(self, health: HealthConfig | None = None, *,
                 sweep_health: SweepHealthConfig | None = None,
                 event_log: ev.SweepLog | None = None,
                 is_good_checkpoint: Callable[[str], bool] = checkpoint_is_good,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.health = health if health is not None else HealthConfig()
        self.sweep_health = resolve_sweep_health(sweep_health, "HealthCallback")
        self.event_log = event_log if event_log is not None else ev.SweepLog()
        self._is_good = is_good_checkpoint
        self._clock = clock
        self._history = (max(self.sweep_health.window, self.sweep_health.min_results)
                         + recent_count(self.sweep_health) + 2)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._controller: Any = None
        self._trials: list[Trial] = []
        self._watch: dict[str, TrialHealth] = {}
        self._stop_requested = False
        self._stop_applied = False

    def __getstate__(self) -> dict[str, Any]:  # pickled with the Tuner's run config
        state = self.__dict__.copy()
        for key in ("_lock", "_controller", "_trials", "_watch"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- bookkeeping -----------------------------------------------------------------
    def _get(self, trial: Trial) -> TrialHealth:
        watch = self._watch.get(trial.trial_id)
        if watch is None:
            watch = TrialHealth(trial.trial_id, deque(maxlen=self._history))
            self._watch[trial.trial_id] = watch
        return watch

    def request_stop(self) -> None:
        """Stop the whole sweep at the next loop turn (any thread may call this)."""
        self._stop_requested = True

    # -- Tune hooks (driver, Tune's event loop) ----------------------------------------
    def setup(self, stop: Any = None, num_samples: Any = None,  # type: ignore[override]
              total_num_samples: Any = None, **info: Any) -> None:
        self._controller = None

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._controller is None:
            self._bind(trials)
        if self._stop_requested and not self._stop_applied:
            self._stop_applied = True
            resumable = executor.interrupt_experiment(self._controller)
            self.event_log.record(ev.STOP_REQUESTED, None, "stop requested: ending every "
                                  "trial; checkpoints are kept" + (
                                      ", unfinished trials resume on restore" if resumable
                                      else " (trials end TERMINATED: not resumable)"),
                                  resumable=resumable)
            return
        now = self._clock()
        with self._lock:
            for trial in trials:
                watch = self._watch.get(trial.trial_id)
                if watch is None or watch.pending is not None or watch.last_progress is None:
                    continue
                if trial.status != "RUNNING":
                    continue
                _, timeout = self.health.progress_bound(watch.slowest_step_s,
                                                        started=watch.started)
                verdict = check_stall(trial.trial_id, watch.last_progress, now, timeout,
                                      watch.last_iteration, time.time())
                if verdict is not None:
                    self._judge(watch, verdict)
            due = [(t, self._watch[t.trial_id].pending) for t in trials
                   if t.trial_id in self._watch and self._watch[t.trial_id].pending]
        for trial, decision in due:
            if decision is not None:
                self._apply(trial, decision)

    def _bind(self, trials: list[Trial]) -> None:
        self._controller = executor.find_controller()
        self._trials = trials
        self.event_log.attach(executor.experiment_dir(self._controller))
        self.event_log.record(ev.SWEEP_STARTED, None,
                              f"health checks on: {self.health}, {self.sweep_health}")

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        with self._lock:
            watch = self._get(trial)
            watch.last_progress = self._clock()
            watch.started = False
        self.event_log.record(ev.TRIAL_STARTED, trial.trial_id,
                              f"trial {trial.trial_id} started", restarts=watch.restarts)

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial,
                        result: dict, **info: Any) -> None:
        h = self.health
        point = Point(int(result.get("training_iteration", 0) or 0), self._clock(),
                      numeric_metrics(result, (*h.watch_metrics,
                                               *self.sweep_health.memory_metrics)),
                      result.get("time_this_iter_s"))
        with self._lock:
            watch = self._get(trial)
            watch.last_progress = point.time
            watch.last_iteration = point.iteration
            watch.started = True
            if point.interval_s is not None:
                watch.slowest_step_s = max(watch.slowest_step_s or 0.0, point.interval_s)
            if watch.pending is not None:
                return
            verdict = check_result(trial.trial_id, watch.points, point, self.sweep_health,
                                   time.time(), watch.best, watch=h.watch_metrics)
            if verdict is None or verdict.check != NONFINITE:
                self._push(watch, point)
            if result.get(CHECKPOINT_PATH_KEY):
                self._record_path(watch, point.iteration, str(result[CHECKPOINT_PATH_KEY]),
                                  result)
            if verdict is not None:
                self._judge(watch, verdict)

    def _push(self, watch: TrialHealth, point: Point) -> None:
        if len(watch.points) == watch.points.maxlen:
            self._update_best(watch, watch.points[0])
        watch.points.append(point)

    def _update_best(self, watch: TrialHealth, point: Point) -> None:
        if not self.health.watch_metrics:
            return
        value = point.metrics.get(self.health.watch_metrics[0])
        if value is None:
            return
        pick = min if self.sweep_health.mode == "min" else max
        watch.best = value if watch.best is None else pick(watch.best, value)

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial,
                      **info: Any) -> None:
        result = trial.latest_checkpoint_result
        if result is None or result.checkpoint is None:
            return
        it = int((result.metrics or {}).get("training_iteration", 0) or 0)
        with self._lock:
            watch = self._get(trial)
            if watch.records and watch.records[-1].path == result.checkpoint.path:
                return
            watch.records.append(CheckpointRecord(it, result.checkpoint.path, result))
            del watch.records[:-MAX_RECORDS]

    def _record_path(self, watch: TrialHealth, iteration: int, path: str,
                     result: dict) -> None:
        metrics = {k: v for k, v in result.items() if k != "config"}
        source = executor.training_result(path, metrics)
        watch.records.append(CheckpointRecord(iteration, path, source))
        del watch.records[:-MAX_RECORDS]

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        self._ended(trial, ev.TRIAL_COMPLETED, "completed")

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        self._ended(trial, ev.TRIAL_ERRORED, "errored")

    def _ended(self, trial: Trial, kind: str, how: str) -> None:
        with self._lock:
            watch = self._get(trial)
            watch.last_progress = None
            restarts = watch.restarts
        self.event_log.record(kind, trial.trial_id, f"trial {trial.trial_id} {how}",
                              restarts=restarts)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.event_log.record(ev.SWEEP_FINISHED, None, "sweep finished",
                              states={t.trial_id: t.status for t in trials})
        if self._controller is not None:
            try:
                executor.publish_event_file(self._controller, self.event_log.path)
            except OSError as exc:  # the log in memory stays complete
                logger.warning("rayguard.tune: could not copy %s to the experiment "
                               "directory: %s", self.event_log.path, exc)

    # -- verdicts and decisions -----------------------------------------------------------
    def _judge(self, watch: TrialHealth, verdict: Verdict) -> None:
        """Record the verdict and plan the decision (lock held)."""
        watch.verdict = verdict
        watch.pending = decide(verdict, watch.restarts, self.health, watch.records,
                               self._is_good)
        self.event_log.record(ev.UNHEALTHY, verdict.trial_id, verdict.detail,
                              verdict=verdict.to_dict())

    def _apply(self, trial: Trial, decision: Decision) -> None:
        with self._lock:
            watch = self._get(trial)
            watch.pending = None
        if trial.status != "RUNNING":
            self.event_log.record(ev.SKIPPED, trial.trial_id,
                                  f"not acting on {decision.check}: trial is "
                                  f"{trial.status}", action=decision.action)
            return
        ckpt = decision.checkpoint
        if decision.action == RESTART:
            executor.restart_trial(self._controller, trial, ckpt, decision.reason)
            reject_later_checkpoints(watch.records, ckpt, decision.reason)
            with self._lock:
                watch.restarts = decision.restarts
                points, watch.records = rewind(list(watch.points), watch.records, ckpt)
                watch.points.clear()
                watch.best = None
                for p in points:
                    self._push(watch, p)
                    self._update_best(watch, p)
                watch.last_progress = None
                watch.last_iteration = ckpt.iteration if ckpt else 0
            self.event_log.record(ev.RESTART, trial.trial_id, decision.reason,
                                  check=decision.check, restarts=decision.restarts,
                                  checkpoint_iteration=ckpt.iteration if ckpt else None,
                                  checkpoint_path=ckpt.path if ckpt else None)
        else:
            self.event_log.record(ev.FAILED, trial.trial_id, decision.reason,
                                  check=decision.check, restarts=decision.restarts)
            executor.fail_trial(self._controller, trial, decision.reason, decision.error())

    # -- reading (any thread) -------------------------------------------------------------
    def status(self) -> dict[str, TrialStatus]:
        out: dict[str, TrialStatus] = {}
        with self._lock:
            trials = list(self._trials)
            watches = dict(self._watch)
        for trial in trials:
            watch = watches.get(trial.trial_id)
            last = dict(trial.last_result or {})
            last.pop("config", None)
            records = watch.records if watch else []
            out[trial.trial_id] = TrialStatus(
                trial.trial_id, str(trial.status), last, watch.restarts if watch else 0,
                watch.verdict if watch else None,
                records[-1].iteration if records else None)
        return out

    # -- experiment checkpoints (resume) ------------------------------------------------
    def get_state(self) -> dict[str, Any] | None:
        with self._lock:
            return {"restarts": {k: w.restarts for k, w in self._watch.items()},
                    "records": {k: list(w.records) for k, w in self._watch.items()},
                    "events": self.event_log.events()}

    def set_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            for trial_id, restarts in state.get("restarts", {}).items():
                watch = self._watch.setdefault(
                    trial_id, TrialHealth(trial_id, deque(maxlen=self._history)))
                watch.restarts = restarts
                watch.records = list(state.get("records", {}).get(trial_id, []))
        if len(self.event_log) == 0:
            self.event_log.extend(list(state.get("events", [])))
