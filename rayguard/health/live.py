"""Live recovery's decisions (``GuardConfig(recovery="live")``), pure: what a surviving rank
does when its training function raised, and the coordinator key that says a peer failed.

Ray Train's controller replaces a failed worker alone (:mod:`rayguard._ray.live_backend`);
before it does, rayguard's controller callback opens the next attempt at the run's
coordinator and leaves a *notice* under :func:`live_key` of the failed attempt: the new
attempt and the ranks being replaced. A survivor sees its peer's loss as an error out of a
collective (gloo: the dead peer's connection closes; NCCL: the communicator aborts) or out
of a released coordinator wait (:class:`rayguard.exceptions.PeersLostError`); it waits a
bounded time for the notice and then rejoins (:mod:`rayguard.train.live`). An error that
does not look like a lost peer, or no notice in time, is this rank's own failure: it
raises as it always did, and Ray's controller chooses again.

Which path a failure takes is one decision, :func:`rayguard.health.recovery.plan_recovery_path`
(pure; applied by :class:`rayguard.controller.callbacks.RayGuardCallback`): Ray replaces the
failed ranks alone, or the whole group restarts, and then the ``restart`` event says why in
``fallback``. A live recovery that fails falls back to one whole-group restart, never to
another replacement alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayguard.failures.patterns import reads_as_collateral

LAST_COMMITTED_KEY = "live:last_committed"
"""Coordinator key: the path of the run's last committed checkpoint (what
``ray.train.get_checkpoint()`` answers on every rank of a live attempt)."""


def live_key(attempt: int) -> str:
    """The coordinator key of the notice that ``attempt`` lost ranks that Ray replaces."""
    return f"live:{attempt}"


def opened_key(attempt: int) -> str:
    """The coordinator key of the same notice, by the attempt it opened."""
    return f"live:opened:{attempt}"


def looks_like_peer_loss(error_type: str, message: str) -> bool:
    """Whether an error may be a peer's loss seen from a survivor (then the survivor waits
    for the notice) rather than this rank's own bug (then it raises at once): the one list
    of such errors, :func:`rayguard.failures.patterns.reads_as_collateral`."""
    return reads_as_collateral(error_type, message)


@dataclass(frozen=True)
class RejoinDecision:
    """What a rank whose training function raised does: rejoin at ``attempt``, or raise
    (``reason`` says why not)."""

    rejoin: bool
    attempt: int | None = None
    replaced: tuple[int, ...] = ()
    reason: str = ""


def plan_rejoin(notice: dict[str, Any] | None, *, rank: int, attempt: int) -> RejoinDecision:
    """The decision of ``rank`` of ``attempt`` given the coordinator's notice (``None``:
    none came in time)."""
    if notice is None:
        return RejoinDecision(False, reason=(
            f"no peer of attempt {attempt} was reported lost: the error is rank {rank}'s own"))
    replaced = tuple(int(r) for r in notice.get("ranks", ()))
    if rank in replaced:
        return RejoinDecision(False, replaced=replaced, reason=(
            f"rank {rank} is itself being replaced in attempt {notice.get('attempt')}"))
    return RejoinDecision(True, int(notice["attempt"]), replaced)


MAX_WAIT_S = 24 * 3600.0
"""The longest wait a notice can ask of a rank (a bound past it is taken as it)."""


def bounded_wait_s(bound: Any, wait_s: float) -> float:
    """A rank's wait for a bound that the controller wrote into a notice: ``bound``, never
    below ``wait_s`` (``HealthConfig(live_wait_s)``) and never past :data:`MAX_WAIT_S`;
    ``wait_s`` where ``bound`` is not a number (missing, a bool, NaN)."""
    if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound == bound:
        # capped before float(): an int past float's range does not overflow
        return max(float(wait_s), float(min(bound, MAX_WAIT_S)))
    return float(wait_s)


def setup_within_s(wait_s: float, start_s: float) -> float:
    """How long the survivors of a live recovery wait at the new attempt's set-up for its
    replacements, which the controller writes into the notice: the replacements' processes
    starting (``start_s``: as long as Ray Train gives a worker group to start), then their
    set-up (``wait_s``, ``HealthConfig(live_wait_s)``). A replacement's process start on a
    loaded node is no reason to restart the whole group."""
    return wait_s + start_s


def setup_wait_s(notice: dict[str, Any] | None, wait_s: float) -> float:
    """A rank's wait at a live attempt's set-up for its peers: the bound in the attempt's
    notice (:func:`setup_within_s`), never below ``wait_s`` (:func:`bounded_wait_s`)."""
    return bounded_wait_s((notice or {}).get("setup_within_s"), wait_s)


__all__ = ["LAST_COMMITTED_KEY", "MAX_WAIT_S", "RejoinDecision", "bounded_wait_s", "live_key",
           "looks_like_peer_loss", "opened_key", "plan_rejoin", "setup_wait_s",
           "setup_within_s"]
