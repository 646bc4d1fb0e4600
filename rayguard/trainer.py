"""RobustTrainer: Ray Train's TorchTrainer with rayguard's set-up and watch around every worker.

Thin by design: the worker-side pipeline is :mod:`rayguard.train.setup`; what runs in Ray
Train's controller (callbacks, rank order, failure and scaling policies) is
:mod:`rayguard.controller`; Ray's private trainer hooks are reached through
:class:`rayguard._ray.train.GuardHooksTrainer`.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
import warnings
from typing import Any, cast

from ray.train import Result
from ray.train.v2.api.config import (  # what ray.train exports under V2
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from rayguard._ray.live_backend import apply_live
from rayguard._ray.spare import has_setup_hook, spare_env
from rayguard._ray.train import GuardHooksTrainer, marked_failed
from rayguard._ray.tune_session import drain_train_reports
from rayguard.checkpoint.interval_advice import interval_settings
from rayguard.config import GuardConfig
from rayguard.constants import (
    EVENTS_FILENAME,
    RAY_ADDRESS_ENV_VAR,
    RAY_TRAIN_POLL_INTERVAL_ENV_VAR,
    propagated_env,
)
from rayguard.events import events_path, make_event
from rayguard.events.upload import LogUploader
from rayguard.exceptions import ConfigError, WorkerTraceback
from rayguard.failures.messages import final_lines, one_line

logger = logging.getLogger("rayguard")


def _with_restart_budget(run_config: RunConfig | None,
                         guard: GuardConfig) -> tuple[RunConfig, str | None]:
    """Ray's default is no restart: ``max_failures=0`` (not told from "not set") becomes
    ``guard.health.max_restarts``, other fields kept, in a copy (the caller's ``RunConfig`` is
    never changed). Returns the run config and, when rayguard chose the budget, a note."""
    run_config = copy.copy(run_config) if run_config is not None else RunConfig()
    # what fit() writes into (the workers' env_vars) is the copy's own, never the caller's
    run_config.worker_runtime_env = copy.deepcopy(run_config.worker_runtime_env)
    run_config.failure_config = failure = copy.copy(run_config.failure_config or FailureConfig())
    if failure.max_failures != 0 or guard.health.max_restarts == 0:
        return run_config, None
    failure.max_failures = guard.health.max_restarts
    return run_config, (
        f"up to {guard.health.max_restarts} restarts (HealthConfig.max_restarts): "
        "FailureConfig(max_failures=0) is Ray's default and reads as unset; for no restarts "
        "pass GuardConfig(health=HealthConfig(max_restarts=0))")


class RobustTrainer(GuardHooksTrainer):
    """A drop-in ``TorchTrainer`` whose workers are pinned, seeded, bound, watched and
    checkpointed with verification. Takes every ``TorchTrainer`` argument plus
    ``guard_config``."""

    scaling_config: ScalingConfig

    @property
    def _rc(self) -> RunConfig:
        """``self.run_config`` as the V2 type it is at run time."""
        return cast(RunConfig, self.run_config)

    def __init__(self, train_loop_per_worker: Any, *, guard_config: GuardConfig | None = None,
                 run_config: RunConfig | None = None, **kwargs: Any) -> None:
        if guard_config is None:
            guard_config = GuardConfig()
        if not isinstance(guard_config, GuardConfig):
            raise ConfigError(
                f"RobustTrainer(guard_config={guard_config!r}): must be a rayguard.GuardConfig. "
                "Fix: pass guard_config=rayguard.GuardConfig(...) or leave it out."
            )
        self.guard_config = guard_config
        self._coordinator: Any = None
        self._cluster_address: str | None = None
        self.last_metrics: dict[str, Any] | None = None
        """Rank 0's last reported metrics once ``fit()`` returned or raised (Ray's
        ``Result.metrics`` holds only the metrics reported with the last checkpoint)."""
        self.last_goodput: Any = None
        """The last ``fit()``'s goodput (:class:`rayguard.observe.goodput.Goodput`, from its
        event log), also the driver's last line."""
        self._live = apply_live(guard_config, kwargs)
        self._user_worker_env: Any = None
        self._uploader: LogUploader | None = None
        user_run_config = run_config is not None
        run_config, note = _with_restart_budget(run_config, guard_config)
        self._budget_note = note if user_run_config else None  # only where 0 may be meant
        super().__init__(train_loop_per_worker, run_config=run_config, **kwargs)
        evict = guard_config.health.straggler_evict_after_s
        if evict is not None and not self.scaling_config.elasticity_enabled:
            warnings.warn(
                f"GuardConfig(health=HealthConfig(straggler_evict_after_s={evict!r})): straggler "
                "eviction needs an elastic run (ScalingConfig(num_workers=(min, max))) and is "
                "ignored here: a fixed-size run cannot leave a node out without waiting for "
                "another. Fix: make the run elastic, or leave straggler_evict_after_s=None",
                UserWarning, stacklevel=2)

    # -- paths -------------------------------------------------------------------------
    @property
    def run_dir(self) -> str:
        """The run directory (``Result.path``)."""
        return self._rc.storage_context.experiment_fs_path

    @property
    def _remote_fs(self) -> Any:
        """The storage filesystem when it is remote (S3, GCS, ...), else None."""
        from rayguard.train.store import store_for

        return store_for(self.run_dir, self._rc.storage_context.storage_filesystem).fs

    # -- Ray Train hooks ----------------------------------------------------------------
    def wrap_train_func(self, train_func: Any) -> Any:
        from rayguard.train.setup import GuardedTrainFn

        if self.running_in_local_mode:
            return train_func
        return GuardedTrainFn(train_func, self.guard_config, self._coordinator, self.run_dir,
                              replica_groups=self._replica_groups and not self._live,
                              max_failures=cast(FailureConfig,
                                                self._rc.failure_config).max_failures,
                              live=self._live,
                              elastic=self._live and self.scaling_config.elasticity_enabled)

    @property
    def _replica_groups(self) -> bool:
        """Whether the backend runs each worker as its own replica group, which Ray's
        controller replaces alone when it fails: Ray's ``TorchftConfig``, or rayguard's live
        recovery (:mod:`rayguard._ray.live_backend`)."""
        return bool(getattr(self.backend_config.backend_cls, "has_replica_groups", False))

    def controller_callbacks(self, callbacks: list[Any]) -> list[Any]:
        from rayguard._ray.cleaner import without_blind_cleaner
        from rayguard._ray.datasets import without_idle_dataset_manager
        from rayguard.controller.callbacks import RayGuardCallback
        from rayguard.controller.rank_order import CoordinatorStore, RankOrder
        from rayguard.health.recovery import recovery_mode

        callbacks = without_blind_cleaner(callbacks)  # no dashboard: it could only warn
        callbacks = without_idle_dataset_manager(callbacks, self.datasets)  # no datasets, no actor

        store = None
        if self._coordinator is not None:
            callbacks.append(RayGuardCallback(
                self._coordinator, quarantine=self.guard_config.health.quarantine_after is not None,
                mode=recovery_mode(replica_groups=self._replica_groups, live=self._live),
                elastic=self._live and self.scaling_config.elasticity_enabled,
                live_wait_s=self.guard_config.health.live_wait_s))
            store = CoordinatorStore(self._coordinator)
        callbacks.append(RankOrder(numa=self.guard_config.numa != "off", store=store,
                                   group_local_ranks=self._live))
        return callbacks

    def controller_policies(self) -> dict[str, Any]:
        from rayguard.controller.failure_policy import GuardFailurePolicy

        policies: dict[str, Any] = {"failure_policy": GuardFailurePolicy(
            cast(FailureConfig, self._rc.failure_config), self._coordinator,
            self.guard_config.health.crash_loop_retries)}
        scaling_policy = self._scaling_policy()
        if scaling_policy is not None:
            policies["scaling_policy"] = scaling_policy
        return policies

    def controller_class(self) -> type | None:
        """Live recovery: a controller whose size changes can be made in place and whose
        replacement of a worker alone falls back to a group restart
        (:mod:`rayguard._ray.resize`)."""
        if not self._live:
            return None
        from rayguard._ray.resize import GuardController

        return GuardController

    def controller_env_vars(self) -> dict[str, str]:
        """The controller (and the actors it starts) join the cluster ``fit()`` runs on."""
        if self._cluster_address is None:
            return {}
        return {RAY_ADDRESS_ENV_VAR: self._cluster_address}

    def _scaling_policy(self) -> Any:
        """Elastic runs only use world sizes that keep the global batch exact; with the
        quarantine on, every run counts only the nodes not quarantined."""
        fence = None
        if self._coordinator is not None and self.guard_config.health.quarantine_after is not None:
            from rayguard.controller.fence import FenceView

            fence = FenceView(self._coordinator)
        if self.guard_config.global_batch_size is None and fence is None:
            return None
        from rayguard.controller.scaling import make_scaling_policy

        return make_scaling_policy(self.scaling_config, self.guard_config, fence, self.run_dir)

    def _coordinator_args(self) -> dict[str, Any]:
        """The run coordinator's ``observe`` (run name, straggler rule) and ``fence``
        arguments (:class:`~rayguard.run.coordinator.RunCoordinator`)."""
        health = self.guard_config.health
        return {"observe": {"run": os.path.basename(self.run_dir.rstrip("/")) or "run",
                            "straggler_threshold": health.straggler_threshold,
                            "straggler_window_s": health.straggler_window_s},
                "fence": self._fence_args()}

    def _fence_args(self) -> dict[str, Any]:
        """The run coordinator's quarantine settings (rayguard.run.fence.NodeFence)."""
        from rayguard.health.quarantine_file import quarantine_path

        health = self.guard_config.health
        elastic = self.scaling_config.elasticity_enabled
        evict = health.straggler_evict_after_s if elastic else None  # warned in __init__
        local = self._remote_fs is None
        return {"quarantine_after": health.quarantine_after,
                "path": str(quarantine_path(self.run_dir)) if local else None,
                "straggler_evict_after_s": evict,
                "straggler_threshold": health.straggler_threshold}

    # -- fit -------------------------------------------------------------------------------
    def fit(self) -> Result:
        if self.running_in_local_mode:
            return super().fit()
        import ray

        from rayguard.logs import configure_logging
        from rayguard.observe.progress import ProgressPrinter
        from rayguard.run.coordinator import start_coordinator
        from rayguard.serialization.register import register_if_enabled

        configure_logging()
        if not ray.is_initialized():
            ray.init()
        self._cluster_address = _cluster_address()
        register_if_enabled(self.guard_config.serializers)
        run_dir = self.run_dir
        if self._remote_fs is None:
            os.makedirs(run_dir, exist_ok=True)
            events_file = str(events_path(run_dir))
        else:  # written locally, uploaded into the run directory every few seconds
            events_file = os.path.join(tempfile.mkdtemp(prefix="rayguard-events-"),
                                       EVENTS_FILENAME)
            self._uploader = LogUploader(events_file, run_dir, self._remote_fs).start()
        self._coordinator = start_coordinator(events_file, **self._coordinator_args())
        coordinator = self._coordinator
        saved_env = self._set_env()
        if self._budget_note:
            logger.info("%s", self._budget_note)
        coordinator.record.remote(make_event(
            "start", f"fit() started: {self.scaling_config.num_workers} worker(s), run dir {run_dir}",
            guard_config=repr(self.guard_config), interval_settings=interval_settings(
                self.guard_config.checkpoint)))
        interval = self.guard_config.progress_interval_s
        printer = ProgressPrinter(coordinator, interval).start() if interval else None
        try:
            result = super().fit()
        except TrainingFailedError as exc:
            error, cause = self._final_error(exc)
            ray.get(coordinator.end.remote(make_event(
                "failed", f"run failed: {one_line(error)}", details=str(error)[:20000])))
            raise error from cause
        except BaseException as exc:
            ray.get(coordinator.end.remote(make_event(
                "failed", f"run failed: {one_line(exc)}", details=str(exc)[:20000])))
            raise
        else:
            ray.get(coordinator.end.remote(make_event("finished", "run finished")))
            return result
        finally:
            if printer is not None:
                printer.stop()
            self._end_run(coordinator, events_file)
            self._restore_env(saved_env)

    def _end_run(self, coordinator: Any, events_file: str) -> None:
        """Read the last metrics, wake any waiter in the coordinator, then end it (killing an
        actor with threads blocked in a gather is what can abort it), and upload the log.
        Inside a Tune trial: first the trial takes the run's last reports
        (:func:`~rayguard._ray.tune_session.drain_train_reports`)."""
        import ray

        drain_train_reports()
        try:
            progress = ray.get(coordinator.get_progress.remote(), timeout=30)
            self.last_metrics = progress.get("metrics")
            ray.get(coordinator.close.remote(), timeout=30)
        except Exception as exc:  # the coordinator died: nothing more to read from it
            logger.debug("rayguard: coordinator unavailable at the end of fit(): %s", exc)
        ray.kill(coordinator)
        self._coordinator = None
        if self._uploader is not None:  # the log as it ends, into the run directory
            self._uploader.stop()
            self._uploader = None
        self._log_goodput(events_file)

    def _log_goodput(self, events_file: str) -> None:
        """The driver's last lines: the run's goodput, and the checkpoint interval that would
        have maximised it, from the log just written."""
        from rayguard.checkpoint.interval_advice import advice_matters, recommend_interval
        from rayguard.events.lines import EventSource
        from rayguard.events.read import iter_events
        from rayguard.observe.goodput import goodput
        from rayguard.observe.goodput_table import headline

        ckpt = self.guard_config.checkpoint
        try:
            events = list(iter_events(EventSource("run", events_file)))
            self.last_goodput = goodput(events)
            advice = recommend_interval(events, mtbf_s=ckpt.mtbf_s,
                                        min_interval_s=ckpt.min_interval_s,
                                        max_interval_s=ckpt.max_interval_s)
        except Exception as exc:  # reading the figures must never fail the run
            logger.debug("rayguard: no goodput figure: %s", exc)
            return
        if advice_matters(advice, ckpt.min_interval_s):
            logger.info("%s", advice.line())  # the log format already says [rayguard]
        logger.info("%s", headline(self.last_goodput))

    def _final_error(self, exc: TrainingFailedError) -> tuple[BaseException, BaseException | None]:
        """The exception ``fit()`` raises: Ray's ``WorkerGroupError`` type (code that catches
        it keeps working) with every worker's whole message (Ray truncates long ones, and
        rayguard's ``Fix:`` lines are at their end), why rayguard stopped retrying, and the
        user's own exception with its worker traceback as the cause."""
        if not isinstance(exc, WorkerGroupError) or not exc.worker_failures:
            return exc, None
        import ray

        from rayguard.controller.failure_policy import STOP_REASON_KEY

        try:
            stop, failures, kills = ray.get([self._coordinator.get.remote(STOP_REASON_KEY),
                                             self._coordinator.failures.remote(),
                                             self._coordinator.kills.remote()], timeout=30)
        except Exception:
            stop, failures, kills = None, {}, {}
        records = {r.rank: r for r in failures.get(max(failures), [])} if failures else {}
        lines, rank = final_lines(exc.worker_failures, records, kills,
                                  stop["rank"] if stop else None, marked_failed)
        if stop:
            lines.append(f"rayguard: {stop['reason']}.")
        lines.append(f"What happened, attempt by attempt: {self.run_dir}/{EVENTS_FILENAME}")
        error = WorkerGroupError("\n".join(lines), exc.worker_failures)
        cause = exc.worker_failures.get(rank)
        record = records.get(rank)
        if cause is not None and record is not None and record.traceback:
            cause.__cause__ = WorkerTraceback(f"rank {rank}, attempt {record.attempt}:\n"
                                              + record.traceback)
        return error, cause

    def _set_env(self) -> dict[str, str | None]:
        """Ray copies its own train variables (the poll interval among them) from the driver
        to the controller; rayguard's ``RAYGUARD_*`` variables set in the driver, and
        ``RAY_ADDRESS`` naming the cluster ``fit()`` runs on, go to the workers through
        ``worker_runtime_env`` (values the user put there win)."""
        if self._user_worker_env is None:  # the first fit(): the user's own, kept apart
            self._user_worker_env = copy.deepcopy(self._rc.worker_runtime_env)
        # every fit() starts from the user's values (a second fit() gets its own spare)
        worker_env = cast(dict, copy.deepcopy(self._user_worker_env))
        self._rc.worker_runtime_env = worker_env
        env_vars = dict(worker_env.get("env_vars") or {})
        for key, value in propagated_env().items():
            env_vars.setdefault(key, value)
        if self._cluster_address is not None:
            env_vars.setdefault(RAY_ADDRESS_ENV_VAR, self._cluster_address)
        if self._live and self.guard_config.health.live_spare and not has_setup_hook(env_vars):
            for key, value in spare_env().items():  # a warm spare process per node
                env_vars.setdefault(key, value)
        if env_vars:
            worker_env["env_vars"] = env_vars
        wanted = {}
        if RAY_TRAIN_POLL_INTERVAL_ENV_VAR not in os.environ:
            wanted[RAY_TRAIN_POLL_INTERVAL_ENV_VAR] = str(self.guard_config.controller_poll_interval_s)
        saved = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)
        return saved

    @staticmethod
    def _restore_env(saved: dict[str, str | None]) -> None:
        os.environ.update({key: value for key, value in saved.items() if value is not None})
        for key in (key for key, value in saved.items() if value is None):
            os.environ.pop(key, None)


def _cluster_address() -> str | None:
    """The GCS address of this driver's cluster (None if unknown, as through Ray Client)."""
    import ray

    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception as exc:
        logger.debug("rayguard: cluster address unknown, RAY_ADDRESS not pinned: %s", exc)
        return None
