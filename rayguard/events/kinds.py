"""The one list of event kinds, for runs and sweeps, and which of them a person must see.

A run's log (:mod:`rayguard.trainer`, the run's coordinator, :mod:`rayguard.observe`) and a
sweep's log (:mod:`rayguard.tune`) draw their kinds from :data:`KINDS` and are checked the
same way (:func:`check_kind`); ``restart``, ``restored`` and ``failed`` mean the same in both.
Readers stay tolerant: a kind not listed here (a newer writer) is kept, never refused.
"""

from __future__ import annotations

# A run's kinds.
RUN_KINDS = (
    "start", "attempt_started", "checkpoint_committed", "checkpoint_rejected",
    "stall_detected", "nan_detected", "worker_died", "restart", "restored", "failed",
    "finished", "preflight_error", "fault_injected", "crash_loop", "not_retried",
    "preemption_notice", "preemption_checkpoint",  # rayguard.train.preemption
    "steps", "straggler",  # rayguard.observe: per-rank step timing summaries, slow ranks
    "node_quarantined", "quarantine_lifted",  # rayguard.run.fence: bad nodes fenced off
    "placement_wait",  # rayguard.controller.fence: a fixed-size run waits for admitted nodes
    "hang_diagnosed",  # rayguard.run.diagnosis: the one decision on a hang (culprits)
    "rejoined",  # rayguard.train.live: a rank joined a live recovery's process group
    "diverged",  # rayguard.health.finite: the loss diverged (HealthConfig(divergence=))
    "resize",  # rayguard.controller.resize: an elastic group resized (in place or restarted)
    "report_released",  # rayguard.controller.replica_barrier: survivors left a report (torchft)
)

# A sweep's kinds (the health callback of rayguard.tune).
SWEEP_STARTED = "sweep_started"
TRIAL_STARTED = "trial_started"
UNHEALTHY = "unhealthy"
RESTART = "restart"
RESTORED = "restored"
FAILED = "failed"
SKIPPED = "skipped"
TRIAL_COMPLETED = "trial_completed"
TRIAL_ERRORED = "trial_errored"
STOP_REQUESTED = "stop_requested"
SWEEP_FINISHED = "sweep_finished"

SWEEP_KINDS = (SWEEP_STARTED, TRIAL_STARTED, UNHEALTHY, RESTART, RESTORED, FAILED, SKIPPED,
               TRIAL_COMPLETED, TRIAL_ERRORED, STOP_REQUESTED, SWEEP_FINISHED)

KINDS = RUN_KINDS + tuple(k for k in SWEEP_KINDS if k not in RUN_KINDS)
"""Every kind a rayguard writer may record, runs' first."""

NOTABLE_KINDS = frozenset({"worker_died", "restart", "stall_detected", "nan_detected", "diverged",
                           "checkpoint_rejected", "crash_loop", "not_retried", "straggler",
                           "preemption_notice", "preemption_checkpoint",
                           "node_quarantined", "quarantine_lifted", "placement_wait",
                           "hang_diagnosed", "resize"})
"""Run kinds printed on the driver's console as they happen (and logged as warnings by the
worker that records them)."""


def check_kind(kind: str) -> str:
    """``kind`` itself when it is one of :data:`KINDS`; a writer never records another."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}")
    return kind
