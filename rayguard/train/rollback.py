"""NaN/inf (and divergence, ``HealthConfig(divergence=...)``) rolled back in place
(``GuardConfig(recovery="live")``): no worker restarts.

A rank that sees a non-finite watched metric at ``rayguard.train.report`` does not raise;
it sets the ``nonfinite`` flag of the report's agreement (:mod:`rayguard.train.agreement`),
so every rank learns it at the same report and raises :class:`RollBack` out of it. The
set-up wrapper (:class:`rayguard.train.setup.GuardedTrainFn`) catches it, calls
:func:`re_enter` and runs the training function again in the same process: the model, the
process group, the compiled code and the data loader's worker processes stay;
``rayguard.train.load_state()`` (and ``ray.train.get_checkpoint()``) then return the last
committed checkpoint, from the memory tier when it holds it, else from disk.

Accounting as a restart: rank 0 opens a new attempt at the run's coordinator (its one
owner, :mod:`rayguard.run.attempts`) and every rank moves to it (the gathers of the new attempt are its own), the event log gets
``restart`` (``path="in_place"``, its phases), ``attempt_started`` and then ``restored``,
so goodput and the progress line count it as one; the run's restart budget
(``FailureConfig(max_failures)``) bounds the in-place rollbacks of a run, past it the run
ends (``FatalNonFiniteMetricError``), and so does a NaN that comes back at the same step
more than ``HealthConfig(crash_loop_retries)`` times (the crash-loop rule). The decision is
:func:`plan_rollback` (pure).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rayguard.exceptions import FatalNonFiniteMetricError
from rayguard.health.divergence import DIVERGED_KEY
from rayguard.health.recovery import LIVE, RecoveryPath, plan_recovery_path

ROLLBACKS_KEY = "in_place_rollbacks"
"""Coordinator key: the run's in-place rollbacks (rank 0 counts): ``{"count", "step",
"repeats"}``."""


class RollBack(BaseException):
    """Raised out of ``rayguard.train.report`` on every rank when a rank's watched metric
    was NaN/inf: not an ``Exception``, so that a loop's ``except Exception`` does not stop
    it on its way to the set-up wrapper."""

    def __init__(self, step: int, *, reported: bool = False) -> None:
        super().__init__(step)
        self.step = step
        self.reported = reported
        """Raised at a ``ray.train.report``: the loop resumes from the last checkpoint it
        reported to Ray (``ray.train.get_checkpoint()``, verified again)."""
        self.seen_at = time.time()


@dataclass(frozen=True)
class RollbackDecision:
    """What the ranks do after a NaN: roll back (``ok``) or end the run (``reason``)."""

    ok: bool
    count: int
    """The run's in-place rollbacks, this one included."""
    repeats: int = 0
    """How many rollbacks before this one, in a row, saw their NaN at this same step."""
    reason: str = ""


def plan_rollback(done: int, max_failures: int, *, step: int, last_step: int | None = None,
                  repeats: int = 0, crash_loop_retries: int = 1,
                  what: str = "NaN/inf") -> RollbackDecision:
    """``done`` rollbacks so far, against Ray's restart budget (``-1``: unlimited), and the
    crash-loop rule: a NaN at the same step as the last rollback's (``last_step``) comes
    back bit for bit from the same checkpoint; more than ``crash_loop_retries`` such
    repeats end the run, as a crash loop of restarts does."""
    count = done + 1
    repeats = repeats + 1 if step == last_step else 0
    if repeats > crash_loop_retries:
        return RollbackDecision(False, count, repeats, (
            f"crash loop: {what} at step {step} again after {repeats} in-place rollback(s) "
            f"to the same checkpoint; HealthConfig(crash_loop_retries={crash_loop_retries}) "
            f"allows {crash_loop_retries} repeat{'s' if crash_loop_retries != 1 else ''}" + (
                "; the replay read the same data: leave it out with ElasticSampler or "
                "rayguard.train.get_context().data_skip_steps" if what == "divergence"
                else "")))
    if 0 <= max_failures < count:
        return RollbackDecision(False, count, repeats, (
            f"{what} again: {done} in-place rollback(s) already, "
            f"FailureConfig(max_failures={max_failures}) allows no more"))
    return RollbackDecision(True, count, repeats)


def re_enter(session: Any, bridge: Any, rollback: RollBack, max_failures: int) -> None:
    """Prepare this rank to run the training function again from the last committed
    checkpoint (every rank calls it after the same report; rank 0 decides)."""
    link, ctx = session.link, session.ctx
    started = time.time()
    pending = session.checkpointer.pending_commit()  # the checkpoint in flight commits first
    mine, what = None, "NaN/inf"
    plan = rollback_path(ctx.world_size, ctx.attempt)
    if ctx.rank == 0:
        if session.guard.health.divergence is not None and (
                link.get(DIVERGED_KEY) or {}).get("step") == rollback.step:
            what = "divergence"
        done = link.get(ROLLBACKS_KEY) or {}
        decision = plan_rollback(int(done.get("count", 0)), max_failures, step=rollback.step,
                                 last_step=done.get("step"), repeats=int(done.get("repeats", 0)),
                                 crash_loop_retries=session.guard.health.crash_loop_retries,
                                 what=what)
        link.mark(ROLLBACKS_KEY, {"count": decision.count, "step": rollback.step,
                                  "repeats": decision.repeats})
        opened = link.open_attempt(plan.kind).number if decision.ok else None
        mine = (decision.ok, decision.reason, opened,
                pending or session.forwarding.last_path)  # a commit returns to rank 0 only
    reported = bridge.latest_reported() if rollback.reported else None
    answers = link.gather(f"rollback{session.report_count}-{bridge.count}", (mine, reported))
    ok, reason, attempt, path = answers[0][0]
    if rollback.reported:  # the newest reported: rank 0's, else the lowest rank that has one
        path = next((r for _, r in answers if r), None)
    if not ok:
        raise FatalNonFiniteMetricError(
            f"rank {ctx.rank} on node {ctx.node_id[:8]}: {reason}; the run ends. Fix: lower the "
            "learning rate, clip gradients, or check the data at that step.")
    agreed = time.time()
    if ctx.rank == 0:
        link.record("restart", f"{what} at step {rollback.step}: {plan.reason} (attempt "
                    f"{attempt})", step=rollback.step, **plan.event_fields(),
                    phases={"agree_s": agreed - rollback.seen_at, "settle_s": agreed - started})
    session.end_attempt_steps()  # the steps so far are the old attempt's (goodput)
    ctx.attempt = attempt
    session.injector.attempt = attempt
    bridge.rolled_back(path, reported=rollback.reported)
    if ctx.rank == 0:
        link.record("attempt_started", f"attempt {attempt} started in place with "
                    f"{ctx.world_size} worker(s)", world_size=ctx.world_size,
                    setup_start_time=started, path=plan.kind.value)


def rollback_path(world_size: int, attempt: int) -> RecoveryPath:
    """The path of an in-place rollback of ``attempt`` (live recovery's, every rank at once):
    :func:`rayguard.health.recovery.plan_recovery_path`."""
    return plan_recovery_path((), world_size, mode=LIVE, attempt=attempt, in_place=True)


__all__ = ["ROLLBACKS_KEY", "RollBack", "RollbackDecision", "plan_rollback", "re_enter",
           "rollback_path"]
