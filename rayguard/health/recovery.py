"""How the run recovers from one failure, as a value (pure): :func:`plan_recovery_path`
chooses the :class:`RecoveryPath` once per failure, and what acts on it reads that value
only (the controller callback, :class:`rayguard.controller.callbacks.RayGuardCallback`, for
a worker's failure; rank 0's :func:`rayguard.train.rollback.re_enter` for a NaN rolled back
in place). The ``restart`` event's ``path``, ``ranks`` and ``fallback`` fields come from it
(:meth:`RecoveryPath.event_fields`).

Every path but a whole-group restart keeps processes: Ray replaces the failed ranks alone
(``live``, ``replica_group``), or every rank re-enters the training function in its own
process (``in_place``). A live recovery that fails falls back to one whole-group restart,
never to another replacement alone; the ``restart`` event says why in ``fallback``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class RecoveryKind(str, Enum):
    """A recovery's path; the value is the ``path`` of its ``restart`` event (a whole-group
    restart's event has none)."""

    RESTART = "restart"
    """Ray restarts the whole worker group (every process new, placed anew). An attempt of
    this kind is a whole-group start, the run's first included."""
    LIVE = "live"
    """Ray replaces the failed ranks alone; rayguard opens the attempt the survivors rejoin
    (``GuardConfig(recovery="live")``)."""
    REPLICA_GROUP = "replica_group"
    """Ray replaces the failed replica groups alone (``TorchftConfig``: torchft's own
    quorum, no new attempt)."""
    RESIZE = "resize"
    """An elastic run lost a node: the elastic policy chooses the new size and the survivors
    keep their processes where the resize can be made in place
    (:func:`rayguard.elastic.in_place.plan_resize`), else the group restarts at that size."""
    ROLLBACK = "in_place"
    """A NaN/inf (or divergence) every rank agreed at a report, rolled back in place: no
    process restarts, every rank re-enters the training function
    (:mod:`rayguard.train.rollback`)."""

    def __str__(self) -> str:
        return self.value


RESTART = RecoveryKind.RESTART
LIVE = RecoveryKind.LIVE
REPLICA_GROUP = RecoveryKind.REPLICA_GROUP
ROLLBACK = RecoveryKind.ROLLBACK
RESIZE = RecoveryKind.RESIZE


@dataclass(frozen=True)
class LiveAttempt:
    """The attempt a live recovery opened, as the controller saw it when a failure ended it."""

    attempt: int
    replaced: tuple[int, ...]
    """The ranks Ray started again for it; the others are its survivors."""
    settled: bool = False
    """It committed a checkpoint since it opened: every rank joined and trained, the
    recovery worked, and a failure now is a new loss."""
    resized: tuple[int, int] | None = None
    """An elastic group resized in place opened it: (old, new) world size (``replaced``
    then holds the ranks the resize dropped, in the old numbering)."""


@dataclass(frozen=True)
class RecoveryPath:
    """How the run recovers from one attempt's failure (:func:`plan_recovery_path`)."""

    kind: RecoveryKind
    ranks: tuple[int, ...]
    """The ranks started again (every rank of the group on a restart, none in place)."""
    reason: str
    """Why this path, in one line."""
    fallback: str | None = None
    """Set when live recovery is on and the whole group restarts: why (the ``restart``
    event's ``fallback``)."""
    attempt: int | None = None
    """The attempt that failed (``None``: not known to the planner's caller)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", RecoveryKind(self.kind))  # ValueError names it

    @property
    def alone(self) -> bool:
        """Whether Ray replaces ranks alone (the others keep their processes)."""
        return self.kind in (LIVE, REPLICA_GROUP)

    def event_fields(self) -> dict[str, Any]:
        """The ``restart`` event's fields that say this path: ``path`` (none on a whole-group
        restart), ``ranks`` (those replaced alone) and ``fallback`` (when set)."""
        out: dict[str, Any] = {}
        if self.kind != RESTART:
            out["path"] = self.kind.value
        if self.alone:
            out["ranks"] = list(self.ranks)
        if self.fallback:
            out["fallback"] = self.fallback
        return out


def recovery_mode(*, replica_groups: bool, live: bool) -> RecoveryKind:
    """What the run's backend allows a failed worker (the planner's ``mode``): ``LIVE``
    (live recovery's backend, every worker its own replica group), ``REPLICA_GROUP``
    (``TorchftConfig``) or, without replica groups, ``RESTART``."""
    if not replica_groups:
        return RESTART
    return LIVE if live else REPLICA_GROUP


def plan_recovery_path(failed_ranks: Collection[int], world_size: int, *, mode: str,
                       attempt: int | None = None, live_attempt: LiveAttempt | None = None,
                       lost_nodes: Sequence[str] = (), in_place: bool = False,
                       elastic: bool = False, returned: Collection[int] = ()) -> RecoveryPath:
    """The path of the recovery from the failure of ``failed_ranks`` of ``world_size`` in
    ``attempt``.

    ``mode``: what the run's backend allows, :data:`LIVE` (``GuardConfig(recovery="live")``),
    :data:`REPLICA_GROUP` (``TorchftConfig``) or :data:`RESTART`. ``live_attempt``: the
    failed attempt, when a live recovery opened it (``None``: a whole-group start or an
    in-place rollback opened it). ``lost_nodes``: the nodes of failed ranks that are gone.
    ``in_place``: the failure is a NaN/inf (or divergence) every rank agreed at a report
    (no worker failed; only live recovery defers one so). ``elastic``: the run's size may
    change (``ScalingConfig(num_workers=(min, max))``). ``returned``: the ranks whose training
    function already returned (they cannot rejoin a replaced rank). The first row that
    applies decides:

    ==  ==================================================  =============  ==============
    #   when                                                path           ``fallback``
    ==  ==================================================  =============  ==============
    1   ``in_place`` (live recovery)                        in_place       --
    2   no rank failed (a scheduling or start-up error)     restart        --
    3   ``mode`` is restart                                 restart        --
    4   live; the failed attempt is a live attempt that     restart        why (which
        has not settled (no commit since it opened),                       survivors or
        whichever of its ranks failed                                      replacements)
    5   every rank failed                                   restart        live: why
    5b  live; a rank's training function returned           restart        which ones
    6   live, elastic; a failed rank's node is lost         resize         --
    7   live; a failed rank's node is lost (Ray's one-      restart        the lost nodes
        rank replacement would wait for its bundle)
    8   replica groups                                      replica_group  --
    9   live                                                live           --
    ==  ==================================================  =============  ==============
    """
    failed = tuple(sorted(set(failed_ranks)))
    every = tuple(range(world_size))
    live = mode == LIVE

    def path(kind: RecoveryKind, ranks: tuple[int, ...], reason: str,
             fallback: str | None = None) -> RecoveryPath:
        return RecoveryPath(kind, ranks, reason, fallback, attempt)

    if in_place:
        if not live:
            raise ValueError(f"an in-place rollback needs live recovery, not mode {str(mode)!r}")
        return path(ROLLBACK, (), "every rank re-enters the training function in its own "
                    "process")
    if not failed:
        return path(RESTART, every, "no rank failed at the last poll: the group restarts (a "
                    "scheduling or start-up error)")
    if mode not in (LIVE, REPLICA_GROUP):
        return path(RESTART, every, f"rank(s) {list(failed)} failed: the worker group restarts")
    if live and live_attempt is not None and not live_attempt.settled:
        why = _live_failed(failed, live_attempt)
        return path(RESTART, every, why, fallback=why)
    if len(failed) >= world_size:
        why = f"every rank failed ({world_size}): there is no survivor to keep"
        return path(RESTART, every, why, fallback=why if live else None)
    if live and returned:
        why = (f"live recovery falls back to a restart of the whole group: rank(s) "
               f"{sorted(returned)} already returned from the training function and cannot "
               f"rejoin a replacement of rank(s) {list(failed)}")
        return path(RESTART, every, why, fallback=why)
    if live and lost_nodes and elastic:
        return path(RESIZE, failed, f"node(s) {', '.join(n[:12] for n in lost_nodes)} of "
                    f"rank(s) {list(failed)} lost: the elastic policy chooses the new size; "
                    "the survivors keep their processes where it can be made in place")
    if live and lost_nodes:
        why = (f"live recovery falls back to a restart of the whole group: node(s) "
               f"{', '.join(n[:12] for n in lost_nodes)} of rank(s) {list(failed)} lost")
        return path(RESTART, every, why, fallback=why)
    if not live:
        return path(REPLICA_GROUP, failed, f"rank(s) {list(failed)} replaced in their replica "
                    "groups (Ray's replica-group restart)")
    return path(LIVE, failed, f"rank(s) {list(failed)} replaced alone; the other workers keep "
                "their processes and rejoin")


def _live_failed(failed: tuple[int, ...], live: LiveAttempt) -> str:
    if live.resized is not None:
        old, new = live.resized
        return (f"live recovery falls back to a restart of the whole group: attempt "
                f"{live.attempt} (resized in place from {old} to {new} workers) failed before "
                f"its first commit, rank(s) {list(failed)} failed in it; a failed resize is "
                "not made in place again")
    survivors = [r for r in failed if r not in live.replaced]
    who = (f"survivor(s) {survivors}" if survivors else f"its replacement(s) {list(failed)}")
    return (f"live recovery falls back to a restart of the whole group: live attempt "
            f"{live.attempt} (rank(s) {list(live.replaced)} replaced) failed before its first "
            f"commit, {who} failed in it; a failed live recovery is not tried alone again")


__all__ = ["LIVE", "REPLICA_GROUP", "RESIZE", "RESTART", "ROLLBACK", "LiveAttempt", "RecoveryKind",
           "RecoveryPath", "plan_recovery_path", "recovery_mode"]
