"""One worker's checkpointer: the commit protocol at ``report(state=...)`` and
``load_state()``, in sync or async mode (``CheckpointConfig(mode=)``).

Sync: every rank agrees on the intent, writes its shard and rank 0 commits, all inside the
report. Async: the ranks agree in the loop (every rank snapshots at the same step), the
snapshot is taken in the loop (back-pressure: the one in flight is waited for first), and
the shard is persisted and committed by a background thread whose gathers do not feed the
watchdog. A background failure is raised at the next report; a committed checkpoint is
handed to ``ray.train.report`` with the next report (:meth:`Checkpointer.take_committed`).
A sharded (DCP) save is a collective on the loop's process group: it runs in the loop in
either mode. A preemption notice commits before the rank may go (sync, in either mode).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rayguard.checkpoint import auth, schemes
from rayguard.config import CheckpointConfig
from rayguard.run.link import RunLink
from rayguard.train.async_checkpoint import AsyncCheckpointer
from rayguard.train.checkpointing import (
    agree_intent,
    load_state,
    maybe_checkpoint,
    save_planned,
    snapshot_payload,
)
from rayguard.train.collective import LinkCollective
from rayguard.train.store import CheckpointStore

logger = logging.getLogger("rayguard")


class Checkpointer:
    """Saves and loads this rank's checkpoints over ``link`` (the loop's link: its waits are
    progress) into ``store``, with the memory ``tier``."""

    def __init__(self, link: RunLink, store: CheckpointStore, config: CheckpointConfig,
                 tier: Any = None) -> None:
        schemes.select(schemes.CONFIG_NAMES[config.hash])  # what this worker's writers use
        if config.key_file is not None:  # this worker signs and checks with the run's key
            auth.use(auth.load_key(config.key_file))
        self.link = link
        self.store = store
        self.config = config
        self.tier = tier
        self.collective = LinkCollective(link)
        """The ranks' agreement during checkpoints, in the training loop."""
        self.async_checkpoints: AsyncCheckpointer | None = None
        """``mode="async"``: the background persistence of this rank."""
        if config.mode == "async":
            self.async_checkpoints = AsyncCheckpointer(heartbeat=link.progress,
                                                       pin_memory=config.pin_memory)
        self._async_saves = 0
        self._committed: str | None = None
        """A checkpoint committed in the background, not yet handed to ``ray.train.report``."""
        self.last_cost_s = 0.0
        """Seconds the last :meth:`save` blocked the loop, without the wait for the previous
        checkpoint (async back-pressure): the cost the interval policy weighs."""
        self._waited_s = 0.0

    # -- report(state=...) ----------------------------------------------------------------
    def collect(self) -> None:
        """Take a finished background save's result; its error is raised here, in the loop."""
        if self.async_checkpoints is not None:
            self._collect(self.async_checkpoints.poll)

    def save(self, state: Any, step: int, sharded: Any, *, report_count: int,
             urgent: bool) -> str | None:
        """Every rank agreed this report may checkpoint: save (``urgent``: a preemption
        notice, committed before this returns). Returns the directory committed in the loop
        (rank 0), else ``None``."""
        started, self._waited_s = time.perf_counter(), 0.0
        try:
            return self._save(state, step, sharded, report_count=report_count, urgent=urgent)
        finally:
            self.last_cost_s = max(0.0, time.perf_counter() - started - self._waited_s)

    def _save(self, state: Any, step: int, sharded: Any, *, report_count: int,
              urgent: bool) -> str | None:
        attempt = self.link.ctx.attempt
        if self.async_checkpoints is not None and not urgent:
            self._save_async(state, step, sharded, report_count)
            return None
        if self.async_checkpoints is not None:
            self._waited_s = self._collect(self.async_checkpoints.wait)
        committed = maybe_checkpoint(self.collective, self.store, state, step, sharded,
                                     report_count=report_count, attempt=attempt, tier=self.tier)
        return None if committed is None else committed.path

    @property
    def in_flight(self) -> bool:
        """An async checkpoint still persists."""
        return self.async_checkpoints is not None and self.async_checkpoints.in_flight

    @property
    def persist_s(self) -> float | None:
        """Seconds the last background save took (``None``: sync mode, or none finished)."""
        return None if self.async_checkpoints is None else self.async_checkpoints.persist_s

    def pending_commit(self) -> str | None:
        """Wait for the checkpoint in flight (its error is raised here) and return the
        newest committed directory not yet handed to Ray, without taking it (an in-place
        rollback resumes from it; the next report still forwards it)."""
        if self.async_checkpoints is not None:
            self._collect(self.async_checkpoints.wait)
        return self._committed

    def take_committed(self) -> str | None:
        """The checkpoint committed in the background since the last report (once)."""
        path, self._committed = self._committed, None
        return path

    def _collect(self, how: Callable[[], Any]) -> float:
        """Take a finished background save's result (``how``: ``poll`` or the waiting
        ``wait``); its error is raised here. Returns the seconds waited."""
        outcome = how()
        waited, committed = outcome if isinstance(outcome, tuple) else (0.0, outcome)
        if committed is not None:
            self._committed = committed.path
        return waited

    def _save_async(self, state: Any, step: int, sharded: Any, report_count: int) -> None:
        """Agree in the loop, wait for the checkpoint in flight (back-pressure), snapshot,
        and persist in the background."""
        checkpointer = self.async_checkpoints
        assert checkpointer is not None
        attempt = self.link.ctx.attempt
        plan = agree_intent(self.collective, state, step, sharded, report_count)
        if plan is None:
            return
        waited = self._waited_s = self._collect(checkpointer.wait)
        if plan.sharded:  # DCP's save is a collective on the loop's process group: in the loop
            committed = save_planned(self.collective, self.store, plan, snapshot_payload(state),
                                     attempt=attempt, sharded=sharded, tier=self.tier)
            self._committed = None if committed is None else committed.path
            return
        payload = snapshot_payload(checkpointer.snapshot(state))  # and this step's RNG state
        self._async_saves += 1
        background = LinkCollective(self.link.quiet())
        plan = replace(plan, tag=f"async-{plan.tag}")  # its gathers never meet the loop's
        event = {"mode": "async", "blocked_s": round(time.perf_counter() - plan.started, 6),
                 "snapshot_s": round(checkpointer.snapshot_s, 6),
                 "backpressure_s": round(waited, 6), "backpressure_waits": checkpointer.waits,
                 "backpressure_total_s": round(checkpointer.waited_s, 6)}
        store, tier = self.store, self.tier
        checkpointer.submit(lambda: save_planned(background, store, plan, payload,
                                                 attempt=attempt, tier=tier, **event))

    # -- the end of the training function ---------------------------------------------------
    def finish(self) -> tuple[bool, str | None]:
        """The function returned: wait for the checkpoint in flight (its error is raised).
        Returns (whether one last report must hand a checkpoint to Ray Train, its path):
        every rank makes that report when this rank saved in the background."""
        checkpointer = self.async_checkpoints
        if checkpointer is None or not self._async_saves:
            return False, None
        timeout_s = self.config.finish_timeout_s
        if checkpointer.in_flight:
            committed = checkpointer.drain(timeout_s)
            if checkpointer.in_flight:
                from rayguard.exceptions import CheckpointError

                ctx = self.link.ctx
                raise CheckpointError(
                    f"rank {ctx.rank} on node {ctx.node_id[:8]}: the last checkpoint was "
                    f"still persisting {timeout_s} s after the training function returned. "
                    "Fix: check the storage's speed, or raise "
                    "CheckpointConfig(finish_timeout_s=...).")
        else:
            committed = checkpointer.poll()
        if committed is not None:
            self._committed = committed.path
        return True, self.take_committed()

    def settle(self) -> None:
        """The function raised: give the checkpoint in flight (a healthy state, taken before
        the failure) a bounded chance to commit; its own error is dropped."""
        checkpointer = self.async_checkpoints
        if checkpointer is None or not checkpointer.in_flight:
            return
        try:
            checkpointer.drain(self.config.finish_timeout_s)
        except Exception as exc:
            logger.warning("rayguard: the checkpoint in flight failed too: %s", exc)

    def close(self) -> None:
        if self.async_checkpoints is not None:
            self.async_checkpoints.close()

    # -- load_state() ---------------------------------------------------------------------
    def load(self, sharded: Any, *, load_count: int,
             on_chosen: Callable[[str | None], None] | None = None) -> Any:
        """The newest checkpoint that verifies, for this rank (a checkpoint in flight
        commits first); ``None``: a fresh start."""
        if self.async_checkpoints is not None:
            self._collect(self.async_checkpoints.wait)
        tier = self.tier.loading(load_count) if self.tier is not None else None
        return load_state(self.collective, self.store, sharded, load_count=load_count,
                          previous_rank=self.link.ctx.previous_rank, tier=tier,
                          on_chosen=on_chosen)

