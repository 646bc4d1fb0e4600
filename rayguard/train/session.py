"""WorkerSession: the per-worker state behind ``rayguard.train.report/heartbeat/load_state``.

Created by the set-up pipeline before the user's function runs; closed after it returns.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from rayguard.config import GuardConfig
from rayguard.events import make_event
from rayguard.exceptions import NonFiniteMetricError, RayGuardError
from rayguard.health.decisions import Decision, check_finite
from rayguard.health.watchdog import Watchdog
from rayguard.observe.steps import StepTimer
from rayguard.testing.faults import Fault, FaultInjector
from rayguard.train.agreement import Agreement, Flags, LocalAgreement, needs_protocol
from rayguard.train.async_checkpoint import AsyncCheckpointer
from rayguard.train.collective import SessionCollective
from rayguard.train.context import GuardContext
from rayguard.train.forwarder import Forwarder
from rayguard.train.preemption import Preemption
from rayguard.train.store import CheckpointStore, LocalStore

logger = logging.getLogger("rayguard")


class FatalNonFiniteMetricError(NonFiniteMetricError):
    """NaN/inf with ``nan_policy="fail"``: the run ends without a retry."""

    fatal = True


def _plain(value: Any) -> Any:
    """Ray Train refuses tensors in metrics: one-element tensors and numpy scalars become
    Python numbers; anything else is passed on unchanged."""
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1:  # torch.Tensor
        return value.item()
    if type(value).__module__ == "numpy" and getattr(value, "size", 0) == 1:
        return value.item()
    return value


def resolve_step(step: int | None, metrics: dict[str, Any], state: Any, last_step: int,
                 keys: tuple[str, ...] = ("step",)) -> int:
    """The step of a report: explicit, else the first of ``metrics[key]`` for ``keys``, else
    ``state['step']``, else one past the last."""
    for candidate in (step, *(metrics.get(k) for k in keys),
                      state.get("step") if isinstance(state, dict) else None):
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            return candidate
    return last_step + 1


class WorkerSession:
    def __init__(self, ctx: GuardContext, guard: GuardConfig, coordinator: Any,
                 faults: tuple[Fault, ...]) -> None:
        self.ctx = ctx
        self.guard = guard
        self.coordinator = coordinator
        self.forwarder = Forwarder()
        self.injector = FaultInjector(faults, rank=ctx.rank, attempt=ctx.attempt, claim=self.claim,
                                      on_fire=self._on_fault)
        self.watchdog = Watchdog(guard.health, on_stall=self._on_stall)
        self.last_step = -1
        self._last_metrics: dict[str, Any] | None = None
        self._progress_sent_at = float("-inf")
        self.report_count = 0
        self.load_count = 0
        self.store: CheckpointStore = LocalStore(ctx.run_dir)
        """Where this run's checkpoints live (chosen once, at set-up: :func:`use_store`)."""
        self.collective = SessionCollective(self)
        """The ranks' agreement during checkpoints, in the training loop."""
        self.async_checkpoints: AsyncCheckpointer | None = None
        """``CheckpointConfig(mode="async")``: the background persistence of this rank."""
        if guard.checkpoint.mode == "async":
            self.async_checkpoints = AsyncCheckpointer(heartbeat=self.watchdog.heartbeat,
                                                       pin_memory=guard.checkpoint.pin_memory)
        self._async_saves = 0
        self._unforwarded: str | None = None
        """A checkpoint committed in the background, not yet handed to ``ray.train.report``."""
        from rayguard.train.checkpointing import SessionMemoryTier

        self.memory_tier = SessionMemoryTier(self)
        """The in-memory tier's hooks (``CheckpointConfig(memory_tier=True)``)."""
        self.agreement: Agreement = LocalAgreement()
        """How ranks agree at each report (set-up replaces it: rayguard.train.agreement)."""
        self.preemption = Preemption(())
        """Preemption notices and ``should_checkpoint()`` (set-up adds the sources)."""
        self.ray_bridge: Any = None
        """Set-up's guard around ``ray.train.report`` (:mod:`rayguard.train.ray_report`)."""
        self.timer = StepTimer(interval_s=guard.health.step_summary_interval_s,  # samples: rank 0
                               metric=(guard.health.watch_metrics or (None,))[0]
                               if ctx.rank == 0 else None)

    @property
    def fs(self) -> Any:
        """The run's pyarrow filesystem when it is remote (``None``: local or shared path)."""
        return self.store.fs

    def use_store(self, store: CheckpointStore) -> None:
        self.store = store

    # -- coordinator helpers --------------------------------------------------------------
    def claim(self, key: str) -> bool:
        """Whether this rank is the first of the run to ask for ``key``."""
        if self.coordinator is None:
            return True
        import ray

        return bool(ray.get(self.coordinator.claim.remote(key)))

    def _on_fault(self, fault: Fault, step: int | None = None) -> None:
        """An injected fault is about to fire at ``step``: say so first (a kill leaves no other
        trace)."""
        self.mark(f"cause:{self.ctx.attempt}:{self.ctx.rank}", f"injected {fault.kind}")
        self.record("fault_injected", f"injected {fault.kind} ({fault.key}; RAYGUARD_FAULTS or "
                    "GuardConfig(faults=))", step=self.last_step if step is None else step,
                    wait=True, fault=fault.kind)

    def raw_report(self, metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        """Ray's own ``ray.train.report`` (set-up puts rayguard in front of the public one:
        :mod:`rayguard.train.ray_report`; what this session forwards is not observed twice)."""
        if self.ray_bridge is not None:
            self.ray_bridge.raw_report(metrics, checkpoint, **kwargs)
            return
        import ray.train

        ray.train.report(metrics, checkpoint=checkpoint, **kwargs)

    def put(self, key: str, value: Any) -> None:
        """Leave a fact with the coordinator (fire-and-forget)."""
        if self.coordinator is not None:
            self.coordinator.put.remote(key, value)

    def wait_for(self, key: str, timeout_s: float = 1800.0) -> Any:
        """A fact another rank leaves with the coordinator, waited for (a wait is progress)."""
        if self.coordinator is None:
            return None
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = ray.get(self.coordinator.get.remote(key))
            if value is not None:
                return value
            self.watchdog.heartbeat()
            time.sleep(0.05)
        raise RayGuardError(f"rank {self.ctx.rank}: no answer for {key!r} in {timeout_s} s")

    def contribute(self, tag: str, value: Any) -> None:
        """Join the gather ``tag`` without waiting for its result (a rank with nothing to
        add where some peers may have something)."""
        if self.coordinator is None or self.ctx.world_size == 1:
            return
        self.coordinator.gather.remote(f"a{self.ctx.attempt}:{tag}", self.ctx.rank,
                                       self.ctx.world_size, value)

    def wait_forwarded(self, future: Any) -> Any:
        """Wait for a forwarded report (Ray's report may wait for the controller); a wait is
        progress."""
        from concurrent.futures import TimeoutError as FutureTimeout

        while True:
            try:
                return future.result(timeout=1.0)
            except FutureTimeout:
                self.watchdog.heartbeat()

    def mark(self, key: str, value: Any) -> None:
        """Leave a fact with the coordinator, waited for (the controller reads it after this
        worker is gone)."""
        if self.coordinator is None:
            return
        import ray

        try:
            ray.get(self.coordinator.put.remote(key, value), timeout=10)
        except Exception as exc:
            logger.debug("rayguard: could not leave %s with the coordinator: %s", key, exc)

    def record(self, kind: str, detail: str, *, step: int | None = None, wait: bool = False,
               **extra: Any) -> None:
        """Add an event to the run's log (fire-and-forget unless ``wait``)."""
        event = make_event(kind, detail, rank=self.ctx.rank, node=self.ctx.node_id,
                           step=step, attempt=self.ctx.attempt, **extra)
        from rayguard.progress import NOTABLE_KINDS

        logger.log(logging.WARNING if kind in NOTABLE_KINDS else logging.DEBUG,
                   "rayguard event %s rank=%s step=%s: %s", kind, self.ctx.rank, step, detail)
        if self.coordinator is None:
            return
        ref = self.coordinator.record.remote(event)
        if wait:
            import ray

            ray.get(ref, timeout=10)

    def gather(self, tag: str, value: Any, *, feed_watchdog: bool = True) -> list[Any]:
        """All ranks' values for ``tag`` (waiting for peers counts as progress unless
        ``feed_watchdog`` is False: a background thread's gather)."""
        if self.coordinator is None or self.ctx.world_size == 1:
            return [value]
        import ray

        ref = self.coordinator.gather.remote(f"a{self.ctx.attempt}:{tag}", self.ctx.rank,
                                             self.ctx.world_size, value)
        while True:
            ready, _ = ray.wait([ref], timeout=1.0)
            if ready:
                result = ray.get(ref)
                if result is None:
                    raise RayGuardError(f"rank {self.ctx.rank}: peers never reached {tag!r}")
                return result
            if feed_watchdog:
                self.watchdog.heartbeat()

    def report_failure(self, exc: BaseException) -> None:
        """Tell the coordinator how this attempt ended (the crash-loop rule and the driver's
        final exception read it). Called by the set-up wrapper before the exception leaves."""
        if self.coordinator is None or not isinstance(exc, Exception):
            return
        import traceback

        import ray

        from rayguard.health.crash_loop import describe_exception

        error_type, origin, summary = describe_exception(exc)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            ray.get(self.coordinator.record_failure.remote(
                self.ctx.rank, self.ctx.attempt, error_type, origin, self.last_step, summary,
                text), timeout=10)
        except Exception as err:  # the user's exception matters more than this record
            logger.debug("rayguard: could not record the failure: %s", err)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.watchdog.start()
        self._optimizer_hook = watch_optimizer_steps(self.watchdog.heartbeat)

    def unwatch(self) -> None:
        """The training function ended: its optimizers' steps are no longer this session's."""
        hook, self._optimizer_hook = getattr(self, "_optimizer_hook", None), None
        if hook is not None:
            hook.remove()

    def close(self, timeout_s: float | None = 600) -> None:
        if self.async_checkpoints is not None:
            self.async_checkpoints.close()
        try:
            self.forwarder.close(timeout_s)
            self._send_progress(final=True)
        finally:
            self.watchdog.stop()
            # the last summary is in the log before fit() records "finished"
            self._send_summary(self.timer.take(), wait_s=10.0)

    def _send_summary(self, summary: dict[str, Any] | None, wait_s: float | None = None) -> None:
        """Step timing to the coordinator, fire-and-forget unless ``wait_s`` (see
        rayguard.observe.steps)."""
        if summary is None or self.coordinator is None:
            return
        summary.update(rank=self.ctx.rank, node=self.ctx.node_id, attempt=self.ctx.attempt,
                       gpu_ids=list(self.ctx.gpu_ids or ()), time=time.time())
        try:
            ref = self.coordinator.step_summary.remote(summary)
            if wait_s is not None:
                import ray

                ray.get(ref, timeout=wait_s)
        except Exception as exc:  # observing must never break the loop
            logger.debug("rayguard: step summary not sent: %s", exc)

    def _send_progress(self, *, final: bool = False) -> None:
        """Rank 0's latest step and metrics to the coordinator (the driver's progress line,
        ``RobustTrainer.last_metrics``): fire-and-forget at most every few seconds, and once
        more, waited for, when the function returns."""
        if self.ctx.rank != 0 or self.coordinator is None or self._last_metrics is None:
            return
        from rayguard.progress import SEND_INTERVAL_S

        now = time.monotonic()
        if not final and now - self._progress_sent_at < SEND_INTERVAL_S:
            return
        self._progress_sent_at = now
        ref = self.coordinator.progress.remote({
            "step": self.last_step, "metrics": self._last_metrics, "time": time.time(),
            "world_size": self.ctx.world_size})
        if final:
            import ray

            try:
                ray.get(ref, timeout=10)
            except Exception as exc:
                logger.debug("rayguard: could not send the final metrics: %s", exc)

    # -- the user-facing calls ---------------------------------------------------------
    def heartbeat(self) -> None:
        self.watchdog.heartbeat()

    def should_checkpoint(self) -> bool:
        return self.preemption.should_checkpoint()

    def observe(self, metrics: dict[str, Any], *, step: int | None = None,
                state: Any = None) -> tuple[dict[str, Any], int]:
        """A report reached this rank (``rayguard.train.report`` or ``ray.train.report``): its
        plain metrics and step; faults fire, NaN/inf raise, the watchdog sees a step."""
        metrics = {k: _plain(v) for k, v in dict(metrics).items()}
        step = resolve_step(step, metrics, state, self.last_step)
        metrics = self.injector.on_report(step, metrics)
        self._guard_finite(metrics, step)
        self.watchdog.step_completed()
        self.last_step = step
        return metrics, step

    def observed(self, metrics: dict[str, Any], step: int, seconds: float) -> None:
        """A report was handled: the driver's progress line and the step timer."""
        self._last_metrics = metrics
        self._send_progress()
        summary = self.timer.on_report(step, metrics, seconds)
        if summary is not None:
            self._send_summary(summary)

    def report(self, metrics: dict[str, Any], *, state: Any = None, step: int | None = None,
               sharded: Any = None) -> None:
        started = time.perf_counter()
        metrics, step = self.observe(metrics, step=step, state=state)
        self.report_count += 1
        checkpoint = None
        if self.async_checkpoints is not None:
            self._collect_async(self.async_checkpoints.poll)  # a background failure raises here
        if state is not None:
            _check_checkpointable(state, self.ctx.rank)
        flags = self.agreement.agree(Flags(state is not None, sharded is not None,
                                           self.preemption.local_flag(self)))
        if needs_protocol(flags, first=self.report_count == 1, world_size=self.ctx.world_size):
            if self.async_checkpoints is not None and not flags.notice:
                self._checkpoint_async(state, step, sharded)
            else:  # sync mode, or a preemption notice: commit before the rank may go
                if self.async_checkpoints is not None:
                    self._collect_async(self.async_checkpoints.wait)
                from rayguard.train.checkpointing import maybe_checkpoint

                committed = maybe_checkpoint(self.collective, self.store, state, step, sharded,
                                             report_count=self.report_count,
                                             attempt=self.ctx.attempt, tier=self.memory_tier)
                checkpoint = None if committed is None else committed.path
        if checkpoint is None:
            checkpoint, self._unforwarded = self._unforwarded, None
        self.forwarder.submit(_forward, self.raw_report, metrics, checkpoint, self.store.fs)
        if self.preemption.after_report(flags, saved=flags.state or flags.sharded):
            from rayguard.train.preemption import on_answered

            on_answered(self, step, checkpoint)
        self.observed(metrics, step, time.perf_counter() - started)

    # -- asynchronous checkpoints (CheckpointConfig(mode="async")) ----------------------------
    def _collect_async(self, how: Any) -> float:
        """Take a finished background save's result (``how``: ``poll`` or the waiting
        ``wait``); its error is raised here, in the loop. Returns the seconds waited."""
        outcome = how()
        waited, committed = outcome if isinstance(outcome, tuple) else (0.0, outcome)
        if committed is not None:
            self._unforwarded = committed.path
        return waited

    def _checkpoint_async(self, state: Any, step: int, sharded: Any) -> None:
        """Agree in the loop (every rank snapshots at the same step), wait for the checkpoint
        in flight (back-pressure), snapshot, and persist in the background."""
        from dataclasses import replace

        from rayguard.train.checkpointing import agree_intent, save_planned, snapshot_payload

        checkpointer = self.async_checkpoints
        assert checkpointer is not None
        plan = agree_intent(self.collective, state, step, sharded, self.report_count)
        if plan is None:
            return
        waited = self._collect_async(checkpointer.wait)
        if plan.sharded:  # DCP's save is a collective on the loop's process group: in the loop
            committed = save_planned(self.collective, self.store, plan, snapshot_payload(state),
                                     attempt=self.ctx.attempt, sharded=sharded,
                                     tier=self.memory_tier)
            self._unforwarded = None if committed is None else committed.path
            return
        payload = snapshot_payload(checkpointer.snapshot(state))  # and this step's RNG state
        self._async_saves += 1
        background = SessionCollective(self, in_loop=False)
        plan = replace(plan, tag=f"async-{plan.tag}")  # its gathers never meet the loop's
        event = {"mode": "async", "blocked_s": round(time.perf_counter() - plan.started, 6),
                 "snapshot_s": round(checkpointer.snapshot_s, 6),
                 "backpressure_s": round(waited, 6), "backpressure_waits": checkpointer.waits,
                 "backpressure_total_s": round(checkpointer.waited_s, 6)}
        checkpointer.submit(lambda: save_planned(background, self.store, plan, payload,
                                                 attempt=self.ctx.attempt,
                                                 tier=self.memory_tier, **event))

    def finish(self) -> None:
        """The training function returned: wait for the checkpoint in flight (its error is
        raised), and hand the last committed one to Ray Train, so that ``fit()`` returns
        only after the last checkpoint committed."""
        checkpointer = self.async_checkpoints
        if checkpointer is None or not self._async_saves:
            return
        timeout_s = self.guard.checkpoint.finish_timeout_s
        if checkpointer.in_flight:
            committed = checkpointer.drain(timeout_s)
            if checkpointer.in_flight:
                from rayguard.exceptions import CheckpointError

                raise CheckpointError(
                    f"rank {self.ctx.rank} on node {self.ctx.node_id}: the last checkpoint was "
                    f"still persisting {timeout_s} s after the training function returned. "
                    "Fix: check the storage's speed, or raise "
                    "CheckpointConfig(finish_timeout_s=...).")
        else:
            committed = checkpointer.poll()
        if committed is not None:
            self._unforwarded = committed.path
        # every rank makes this one extra report (Ray Train's report is a collective)
        path, self._unforwarded = self._unforwarded, None
        self.forwarder.submit(_forward, self.raw_report, self._last_metrics or {}, path,
                              self.store.fs)

    def settle(self) -> None:
        """The training function raised: give the checkpoint in flight (a healthy state, taken
        before the failure) a bounded chance to commit; its own error is dropped."""
        checkpointer = self.async_checkpoints
        if checkpointer is None or not checkpointer.in_flight:
            return
        try:
            checkpointer.drain(self.guard.checkpoint.finish_timeout_s)
        except Exception as exc:
            logger.warning("rayguard: the checkpoint in flight failed too: %s", exc)

    def load_state(self, sharded: Any = None) -> Any:
        """``rayguard.train.load_state()``: this rank's state from the newest checkpoint that
        verifies (``None``: a fresh start)."""
        from rayguard.train.checkpointing import load_state

        self.injector.on_load()
        self.load_count += 1
        if self.async_checkpoints is not None:  # a checkpoint in flight commits first
            self._collect_async(self.async_checkpoints.wait)
        restored = load_state(self.collective, self.store, sharded, load_count=self.load_count,
                              previous_rank=self.ctx.previous_rank, tier=self.memory_tier,
                              on_chosen=self._loading)
        self.watchdog.heartbeat()
        if restored is None:
            return None
        if restored.step is not None:
            self.last_step = restored.step
        return restored.state

    def _loading(self, path: str | None) -> None:
        """The checkpoint this attempt reads (the crash-loop rule rejects one that every
        attempt of a loop failed to load)."""
        if self.ctx.rank == 0:
            self.put(f"loaded:{self.ctx.attempt}", path)

    def _guard_finite(self, metrics: dict[str, Any], step: int) -> None:
        health = self.guard.health
        decision = check_finite(metrics, health.watch_metrics, policy=health.nan_policy, step=step)
        if decision.ok:
            return
        self.record("nan_detected", f"{decision.reason}; policy {health.nan_policy}",
                    step=step, wait=True, value=str(decision.value))
        self._flush_quietly()
        cls = FatalNonFiniteMetricError if decision.action == "fail" else NonFiniteMetricError
        what = ("the run ends (nan_policy='fail')" if decision.action == "fail" else
                "the worker group restarts from the last verified checkpoint before it")
        raise cls(f"rank {self.ctx.rank} on node {self.ctx.node_id}: {decision.reason}; {what}. "
                  "Fix: lower the learning rate, clip gradients, or check the data at that step.")

    def _flush_quietly(self, timeout_s: float = 30) -> None:
        try:
            self.forwarder.flush(timeout_s=timeout_s)
        except Exception:  # the failure being raised matters more
            pass

    def _on_stall(self, decision: Decision) -> None:
        """Runs in the watchdog thread: dump stacks, record, end this worker."""
        self.mark(f"cause:{self.ctx.attempt}:{self.ctx.rank}", f"killed by rayguard: {decision.check}")
        self.mark(f"killed:{self.ctx.attempt}:{self.ctx.rank}", decision.reason)
        path = dump_stacks(self.ctx, local_run_dir=self.fs is None)
        detail = f"{decision.reason}; stacks in {path}" if path else decision.reason
        try:
            self.record("stall_detected", detail, step=self.last_step, wait=True,
                        timeout_s=decision.threshold, bound=decision.check, stacks=path)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)


def watch_optimizer_steps(heartbeat: Any) -> Any:
    """Every ``optimizer.step()`` in this process is progress for the watchdog (a heartbeat;
    not a step: the step timer measures reports). A framework loop that reports only at its
    saves or epoch ends (Transformers, Lightning) is then seen alive between its reports.
    Returns the hook's handle (``None`` where torch has no global optimizer hook)."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:  # pragma: no cover - torch >= 2.4 has it
        return None
    return register_optimizer_step_post_hook(lambda *args, **kwargs: heartbeat())


def _check_checkpointable(state: Any, rank: int) -> None:
    """Fail fast, before any peer waits for this rank, on a value no checkpoint can hold; the
    path named is the user's own (``state['cfg']``)."""
    from rayguard.checkpoint.format import encode
    from rayguard.checkpoint.sharded import dtensor_error_message, find_distributed_tensors
    from rayguard.exceptions import SerializationError, StateNotCheckpointableError

    paths = find_distributed_tensors(state)
    if paths:
        raise StateNotCheckpointableError(dtensor_error_message(paths, rank))
    try:
        encode(state)
    except SerializationError as exc:
        raise StateNotCheckpointableError(
            f"rank {rank}: report(state=...): {exc}") from None


def _forward(report: Any, metrics: dict[str, Any], path: str | None, fs: Any) -> None:
    """Hand metrics, and the directory of a committed checkpoint, to Ray's own report
    (``report``; no upload: the checkpoint is already in the run directory)."""
    if path is None:
        report(metrics)
        return
    from ray.train import Checkpoint, CheckpointUploadMode

    checkpoint = Checkpoint.from_directory(path) if fs is None else Checkpoint(path=path,
                                                                               filesystem=fs)
    report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def dump_stacks(ctx: GuardContext, *, local_run_dir: bool = True) -> str | None:
    """Write the stacks of every thread of this worker into the run directory (with remote
    storage: a fresh private directory, ``mkdtemp`` mode 0700, in the node's temporary
    directory; the event names the file and the node). No write follows a link: the folder
    is opened with O_NOFOLLOW and the file created in it with O_CREAT|O_EXCL|O_NOFOLLOW, so
    links or files another user planted there are never written through."""
    import faulthandler
    import shutil
    import subprocess
    import tempfile

    name = f"rank{ctx.rank}-attempt{ctx.attempt}-{int(time.time())}-{os.getpid()}.txt"
    try:
        if local_run_dir:
            directory = os.path.join(ctx.run_dir, "rayguard_stacks")
            os.makedirs(directory, exist_ok=True)
        else:
            directory = tempfile.mkdtemp(prefix="rayguard_stacks-")
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        path = os.path.join(directory, name)
        with os.fdopen(fd, "w") as f:
            f.write(f"# rank {ctx.rank} pid {os.getpid()} node {ctx.node_id}: Python stacks\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
            py_spy = shutil.which("py-spy")
            if py_spy:
                f.write("\n# native + Python stacks (py-spy dump --native)\n")
                f.flush()
                proc = subprocess.run([py_spy, "dump", "--native", "--pid", str(os.getpid())],
                                      capture_output=True, text=True, timeout=20)
                f.write(proc.stdout or proc.stderr)
        return path
    except Exception as exc:  # a failed dump must not stop the restart
        logger.warning("rayguard: could not dump stacks: %s", exc)
        return None

