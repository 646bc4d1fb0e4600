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
raises as it always did, and Ray's controller chooses again (:func:`plan_recovery_path`).

Which path a failure takes is one decision, :func:`plan_recovery_path` (pure; applied by
:class:`rayguard.controller.callbacks.RayGuardCallback`): Ray replaces the failed ranks
alone, or the whole group restarts, and then the ``restart`` event says why in
``fallback``. A live recovery that fails falls back to one whole-group restart, never to
another replacement alone.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
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


RESTART = "restart"
"""Ray restarts the whole worker group (every process new, placed anew)."""
LIVE = "live"
"""Ray replaces the failed ranks alone; rayguard opens the attempt the survivors rejoin."""
REPLICA_GROUP = "replica_group"
"""Ray replaces the failed replica groups alone (``TorchftConfig``: torchft's own quorum)."""


@dataclass(frozen=True)
class LiveAttempt:
    """The attempt a live recovery opened, as the controller saw it when a failure ended it."""

    attempt: int
    replaced: tuple[int, ...]
    """The ranks Ray started again for it; the others are its survivors."""
    settled: bool = False
    """It committed a checkpoint since it opened: every rank joined and trained, the
    recovery worked, and a failure now is a new loss."""


@dataclass(frozen=True)
class RecoveryPath:
    """How the run recovers from one attempt's failure (:func:`plan_recovery_path`)."""

    path: str
    """:data:`LIVE`, :data:`REPLICA_GROUP` (the failed ranks alone) or :data:`RESTART`."""
    ranks: tuple[int, ...]
    """The ranks started again (every rank of the group on a restart)."""
    reason: str
    """Why this path, in one line."""
    fallback: str | None = None
    """Set when live recovery is on and the whole group restarts: why (the ``restart``
    event's ``fallback``)."""

    @property
    def alone(self) -> bool:
        """Whether Ray replaces ranks alone (the others keep their processes)."""
        return self.path != RESTART


def plan_recovery_path(failed_ranks: Collection[int], world_size: int, *, mode: str,
                       live_attempt: LiveAttempt | None = None,
                       lost_nodes: Sequence[str] = ()) -> RecoveryPath:
    """The path of the recovery from the failure of ``failed_ranks`` of ``world_size``.

    ``mode``: what the run's backend allows, :data:`LIVE` (``GuardConfig(recovery="live")``),
    :data:`REPLICA_GROUP` (``TorchftConfig``) or :data:`RESTART`. ``live_attempt``: the
    failed attempt, when a live recovery opened it (``None``: a whole-group start or an
    in-place rollback opened it). ``lost_nodes``: the nodes of failed ranks that are gone.
    The first row that applies decides:

    ==  ==================================================  =============  ==============
    #   when                                                path           ``fallback``
    ==  ==================================================  =============  ==============
    1   no rank failed (a scheduling or start-up error)     restart        --
    2   ``mode`` is restart                                 restart        --
    3   live; the failed attempt is a live attempt that     restart        why (which
        has not settled (no commit since it opened),                       survivors or
        whichever of its ranks failed                                      replacements)
    4   every rank failed                                   restart        live: why
    5   live; a failed rank's node is lost (Ray's one-      restart        the lost nodes
        rank replacement would wait for its bundle)
    6   replica groups                                      replica_group  --
    7   live                                                live           --
    ==  ==================================================  =============  ==============
    """
    failed = tuple(sorted(set(failed_ranks)))
    every = tuple(range(world_size))
    live = mode == LIVE
    if not failed:
        return RecoveryPath(RESTART, every, "no rank failed at the last poll: the group "
                            "restarts (a scheduling or start-up error)")
    if mode not in (LIVE, REPLICA_GROUP):
        return RecoveryPath(RESTART, every, f"rank(s) {list(failed)} failed: the worker group "
                            "restarts")
    if live and live_attempt is not None and not live_attempt.settled:
        why = _live_failed(failed, live_attempt)
        return RecoveryPath(RESTART, every, why, fallback=why)
    if len(failed) >= world_size:
        why = f"every rank failed ({world_size}): there is no survivor to keep"
        return RecoveryPath(RESTART, every, why, fallback=why if live else None)
    if live and lost_nodes:
        why = (f"live recovery falls back to a restart of the whole group: node(s) "
               f"{', '.join(n[:12] for n in lost_nodes)} of rank(s) {list(failed)} lost")
        return RecoveryPath(RESTART, every, why, fallback=why)
    if not live:
        return RecoveryPath(REPLICA_GROUP, failed, f"rank(s) {list(failed)} replaced in their "
                            "replica groups (Ray's replica-group restart)")
    return RecoveryPath(LIVE, failed, f"rank(s) {list(failed)} replaced alone; the other "
                        "workers keep their processes and rejoin")


def _live_failed(failed: tuple[int, ...], live: LiveAttempt) -> str:
    survivors = [r for r in failed if r not in live.replaced]
    who = (f"survivor(s) {survivors}" if survivors else f"its replacement(s) {list(failed)}")
    return (f"live recovery falls back to a restart of the whole group: live attempt "
            f"{live.attempt} (rank(s) {list(live.replaced)} replaced) failed before its first "
            f"commit, {who} failed in it; a failed live recovery is not tried alone again")


__all__ = ["LAST_COMMITTED_KEY", "LIVE", "REPLICA_GROUP", "RESTART", "LiveAttempt",
           "RecoveryPath", "RejoinDecision", "live_key", "looks_like_peer_loss", "opened_key",
           "plan_recovery_path", "plan_rejoin"]
