"""WorkerSession: the per-worker state behind ``rayguard.train.report/heartbeat/load_state``.

Built by set-up (:func:`rayguard.train.setup.build_session`) from parts that are complete
when they are passed in: the link to the run, the watchdog, the checkpointer, the
preemption watch, the report forwarding, the fault injector. What is left here is the
wiring of the user-facing calls: each report is observed (faults, NaN/inf, the watchdog's
step), agreed, checkpointed, forwarded to Ray Train and timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rayguard import runtime
from rayguard.checkpoint.checkpointable import check_checkpointable
from rayguard.config import GuardConfig
from rayguard.faults import Fault, FaultInjector
from rayguard.faults.injector import announcer
from rayguard.health.divergence import DIVERGED_KEY, offer_data_skip, plan_skip
from rayguard.health.finite import FiniteGuard
from rayguard.health.watchdog import Watchdog
from rayguard.observe.steps import StepTimer
from rayguard.run.facts import loaded_key
from rayguard.run.link import RunLink
from rayguard.train.agreement import Agreement, Flags, needs_protocol
from rayguard.train.checkpointer import Checkpointer
from rayguard.train.forwarding import ReportForwarding
from rayguard.train.pacing import CheckpointPacing
from rayguard.train.preemption import PreemptionWatch
from rayguard.train.rollback import RollBack
from rayguard.train.steps import plain, resolve_step


class WorkerSession:
    """One worker's session: ``report``, ``load_state``, ``heartbeat``, ``should_checkpoint``
    (and ``observe``/``observed`` for the loops that report through ``ray.train.report``)."""

    def __init__(self, link: RunLink, guard: GuardConfig, *, watchdog: Watchdog,
                 checkpointer: Checkpointer, agreement: Agreement, preemption: PreemptionWatch,
                 forwarding: ReportForwarding, faults: tuple[Fault, ...] = (),
                 pacing: CheckpointPacing | None = None) -> None:
        self.link = link
        self.ctx = link.ctx
        self.guard = guard
        self.watchdog = watchdog
        self.checkpointer = checkpointer
        self.agreement = agreement
        self.preemption = preemption
        self.pacing = pacing or CheckpointPacing()
        """The checkpoint interval: rank 0 decides, the agreement tells every rank."""
        self.forwarding = forwarding
        self.forwarder = forwarding.forwarder
        self.injector = FaultInjector(faults, rank=link.ctx.rank, attempt=link.ctx.attempt,
                                      claim=link.claim,
                                      on_fire=announcer(link, lambda: self.last_step))
        self.finite = FiniteGuard(guard.health, link, self.forwarder.flush_quietly)
        self.last_step = -1
        self.step_unit = "step"
        """What ``last_step`` counts: a ``ray.train.report`` loop's step key (``epoch``...,
        :func:`rayguard.train.steps.step_unit`), shown by the driver's progress line."""
        self.nonfinite = False
        """This report's watched metric was NaN/inf here (``recovery="live"``)."""
        self.resize_watch: Callable[[], None] | None = None
        """Asked at every report (an elastic run under live recovery): raises when the run
        resizes this attempt in place (:class:`rayguard.train.live.ResizeWatch`)."""
        self.report_count = 0
        self.load_count = 0
        self._last_metrics: dict[str, Any] | None = None
        self._progress_sent_at = float("-inf")
        self.timer = StepTimer(interval_s=guard.health.step_summary_interval_s,  # samples: rank 0
                               metric=(guard.health.watch_metrics or (None,))[0]
                               if link.ctx.rank == 0 else None)

    @property
    def async_checkpoints(self) -> Any:
        """``CheckpointConfig(mode="async")``: the background persistence of this rank."""
        return self.checkpointer.async_checkpoints

    # -- the user-facing calls ---------------------------------------------------------
    def heartbeat(self) -> None:
        if self.resize_watch is not None:  # a loop that waits without reporting leaves too
            self.resize_watch()
        self.watchdog.heartbeat()

    def should_checkpoint(self) -> bool:
        return self.preemption.should_checkpoint() or self.pacing.should_checkpoint()

    def observe(self, metrics: dict[str, Any], *, step: int | None = None,
                state: Any = None, defer_nan: bool = False) -> tuple[dict[str, Any], int]:
        """A report reached this rank (``rayguard.train.report`` or ``ray.train.report``): its
        plain metrics and step; faults fire, NaN/inf raise (``defer_nan``: set
        :attr:`nonfinite` instead), the watchdog sees a step."""
        if self.resize_watch is not None:
            self.resize_watch()
        metrics = {k: plain(v) for k, v in dict(metrics).items()}
        step = resolve_step(step, metrics, state, self.last_step)
        metrics = self.injector.on_report(step, metrics)
        self.nonfinite = self.finite.check(metrics, step, defer=defer_nan)
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

    def agree_finite(self, step: int) -> None:
        """A ``ray.train.report`` under ``GuardConfig(recovery="live")``, before anything of
        it is sealed or handed to Ray: when any rank's watched metric was NaN/inf
        (:meth:`observe` with ``defer_nan``), every rank raises :class:`RollBack` here and
        re-enters the training function in its own process."""
        flags = self.agreement.agree(Flags(nonfinite=self.nonfinite))
        if flags.nonfinite:
            self.nonfinite = False
            raise RollBack(step, reported=True)

    def paced(self, *, checkpointed: bool, seconds: float) -> None:
        """A ``ray.train.report`` was handled (every rank makes it: Ray's report is a
        collective). With ``CheckpointConfig(interval=True)`` rank 0's interval flag rides on
        the agreement here too, so ``should_checkpoint()`` works in such loops;
        ``checkpointed``: this rank passed a checkpoint, ``seconds``: the report's time (the
        cost the policy weighs: sealing and Ray's upload, not the loop's own save before)."""
        if not self.guard.checkpoint.interval:
            return
        flags = self.agreement.agree(Flags(state=checkpointed,
                                           interval=self.pacing.local_flag()))
        self.pacing.after_report(flags, saved=flags.state,
                                 cost_s=seconds if flags.state else None)

    def report(self, metrics: dict[str, Any], *, state: Any = None, step: int | None = None,
               sharded: Any = None) -> None:
        started = time.perf_counter()
        metrics, step = self.observe(metrics, step=step, state=state,
                                     defer_nan=self.guard.recovery == "live")
        self.report_count += 1
        self.checkpointer.collect()  # a background failure raises here
        if state is not None and not self.nonfinite:
            check_checkpointable(state, self.ctx.rank)
        flags = self.agreement.agree(Flags(
            state is not None, sharded is not None, self.preemption.local_flag(step),
            self.pacing.local_flag(in_flight=self.checkpointer.in_flight), self.nonfinite))
        if flags.nonfinite:  # some rank's metric is NaN/inf: every rank rolls back in place
            self.nonfinite = False
            raise RollBack(step)
        checkpoint = None
        if needs_protocol(flags, first=self.report_count == 1, world_size=self.ctx.world_size):
            checkpoint = self.checkpointer.save(state, step, sharded,
                                                report_count=self.report_count,
                                                urgent=flags.notice)
        if checkpoint is None:
            checkpoint = self.checkpointer.take_committed()
        self.forwarding.forward(metrics, checkpoint)
        saved = flags.state or flags.sharded
        self.pacing.after_report(flags, saved=saved, cost_s=self.checkpointer.last_cost_s,
                                 persist_s=self.checkpointer.persist_s)
        self.preemption.after_report(flags, saved=saved, step=step, checkpoint=checkpoint)
        self.observed(metrics, step, time.perf_counter() - started)

    def load_state(self, sharded: Any = None) -> Any:
        """``rayguard.train.load_state()``: this rank's state from the newest checkpoint that
        verifies (``None``: a fresh start)."""
        self.injector.on_load()
        self.load_count += 1
        before = self.last_step  # an in-place rollback: the step this process reached
        restored = self.checkpointer.load(sharded, load_count=self.load_count,
                                          on_chosen=self._loading)
        self.watchdog.heartbeat()
        self.timer.begin()
        if restored is not None:
            self.replays(before)
        self.pacing.resumed()  # the checkpoint interval counts the work from here
        self._plan_data_skip(None if restored is None else restored.step)
        if restored is None:
            return None
        if restored.step is not None:
            self.last_step = restored.step
        return restored.state

    def replays(self, before: int) -> None:
        """The loop got a checkpoint back (``load_state``, ``ray.train.get_checkpoint()``):
        the lead rank times the steps it does again, and counts their optimizer steps, up to
        the highest the run reached (the coordinator's, or ``before``: the step this process
        reached, an in-place rollback)."""
        if self.ctx.rank == 0:
            known = [s for s in (self.link.high_step(), before) if isinstance(s, int)]
            self.timer.replaying(max(known) if known else None)

    def optimizer_stepped(self) -> None:
        """An ``optimizer.step()`` of this process (counted for the step summaries)."""
        self.timer.optimizer_stepped()

    def _plan_data_skip(self, restored_step: int | None) -> None:
        """The steps of data this restore leaves out (``HealthConfig(divergence=...)``)."""
        divergence = self.guard.health.divergence
        if divergence is None or not divergence.skip_data:
            return
        diverged = self.link.get(DIVERGED_KEY) if restored_step is not None else None
        steps = plan_skip(restored_step, (diverged or {}).get("step"))
        self.ctx.data_skip_steps = steps
        offer_data_skip(steps)

    def _loading(self, path: str | None) -> None:
        """The checkpoint this attempt reads (the crash-loop rule rejects one that every
        attempt of a loop failed to load)."""
        if self.ctx.rank == 0:
            self.link.put(loaded_key(self.ctx.attempt), path)

    # -- the end of the training function ----------------------------------------------------
    def finish(self) -> None:
        """The function returned: wait for the checkpoint in flight (its error is raised),
        and hand the last committed one to Ray Train, so that ``fit()`` returns only after
        the last checkpoint committed (every rank makes this one extra report: Ray Train's
        report is a collective)."""
        forward, path = self.checkpointer.finish()
        if forward:
            self.forwarding.forward(self._last_metrics or {}, path)

    def end_attempt_steps(self) -> None:
        """Send the step summary of the attempt that ends in this process (an in-place
        rollback, a survivor's live rejoin), under that attempt."""
        self._send_summary(self.timer.end_attempt())

    def settle(self) -> None:
        """The function raised: the checkpoint in flight gets a bounded chance to commit."""
        self.checkpointer.settle()

    def report_failure(self, exc: BaseException) -> None:
        """Tell the run how this attempt ended (before the exception leaves the worker)."""
        self.link.record_failure(exc, self.last_step)

    def close(self, timeout_s: float | None = 600) -> None:
        self.checkpointer.close()
        try:
            self.forwarder.close(timeout_s)
            self._send_progress(final=True)
        finally:
            self.watchdog.stop()
            # the last summary is in the log before fit() records "finished"
            self._send_summary(self.timer.take(), wait=True)

    # -- what the driver sees ---------------------------------------------------------------
    def _send_summary(self, summary: dict[str, Any] | None, *, wait: bool = False) -> None:
        """Step timing to the run (see rayguard.observe.steps)."""
        if summary is None:
            return
        summary.update(rank=self.ctx.rank, node=self.ctx.node_id, attempt=self.ctx.attempt,
                       gpu_ids=list(self.ctx.gpu_ids or ()), time=time.time())
        self.link.send_summary(summary, wait=wait)

    def _send_progress(self, *, final: bool = False) -> None:
        """Rank 0's latest step and metrics (the driver's progress line,
        ``RobustTrainer.last_metrics``): at most every few seconds, and once more, waited
        for, when the function returns."""
        if self.ctx.rank != 0 or self._last_metrics is None:
            return
        from rayguard.constants import SEND_INTERVAL_S

        now = time.monotonic()
        if not final and now - self._progress_sent_at < SEND_INTERVAL_S:
            return
        self._progress_sent_at = now
        self.link.send_progress({"step": self.last_step, "metrics": self._last_metrics,
                                 "time": time.time(), "world_size": self.ctx.world_size,
                                 "unit": self.step_unit},
                                wait=final)


class LateSession:
    """The session, for the parts of set-up built before it: the stall responder reads its
    last step (calling this), the optimizer hook counts its steps into it."""

    session: WorkerSession | None = None

    def __call__(self) -> int:
        return -1 if self.session is None else self.session.last_step

    def optimizer_stepped(self) -> None:
        if self.session is not None:
            self.session.optimizer_stepped()


def set_current_session(session: WorkerSession | None) -> None:
    """Set-up: the session of this worker (its runtime) while a training function runs."""
    runtime.current().session = session


def current_session() -> WorkerSession | None:
    """The session ``rayguard.train.report/heartbeat/load_state`` act on (``None``: no
    training function of a RobustTrainer runs in this worker)."""
    return runtime.current().session
