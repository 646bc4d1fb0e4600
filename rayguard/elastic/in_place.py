"""Resizing an elastic run in place (pure): which workers keep their processes, which ranks
they take, and where new workers go, or why the whole group restarts instead.

With live recovery on an elastic run (``ScalingConfig(num_workers=(min, max))``,
``GuardConfig(recovery="live")``), a size change that the elastic policy chooses is made
without a Ray worker-group restart where :func:`plan_resize` says it can be:

* **shrink** (a node lost, no capacity to replace it): the survivors keep their processes
  and take ranks ``0 .. new - 1`` in their old order (the remap policy of
  :mod:`rayguard.elastic.remap`: survivor ``i`` of ``S`` gets ``min(previous, new - S + i)``,
  here ``i``); survivors beyond the new size (the size was rounded down to a valid one) are
  stopped, the highest ranks first;
* **grow** (capacity back): the workers keep their ranks, the new workers take the next
  ones, each in a free bundle of the group's placement group (the bundles of the workers a
  shrink dropped; Ray places a lost node's bundle again once a node can hold it).

Everything else restarts the whole group, as Ray's elastic policy does, and the reason is
recorded: a size the survivors cannot fill alone, a grow past the group's free bundles, a
failure that is not a lost node, a second loss in the resize's own attempt.

The controller carries the plan out (:mod:`rayguard.controller.resize` over
:mod:`rayguard._ray.resize`); the kept workers learn of it from the run coordinator's notice
(:func:`is_resize`), take their new place (:func:`places`' arithmetic) and set up again in
their own processes (:mod:`rayguard.train.live`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayguard.health.live import bounded_wait_s

SHRINK = "shrink"
GROW = "grow"


@dataclass(frozen=True)
class ResizePlan:
    """One size change of a running group (:func:`plan_resize`)."""

    old_world: int
    new_world: int
    keep: tuple[int, ...] = ()
    """Old ranks that keep their processes, in new-rank order (new rank ``i`` is old rank
    ``keep[i]``)."""
    lost: tuple[int, ...] = ()
    """Old ranks whose workers failed (their node is gone)."""
    retire: tuple[int, ...] = ()
    """Old ranks that did not fail but are stopped (more survivors than the new size)."""
    bundles: tuple[int, ...] = ()
    """Grow: the placement-group bundle of each new worker, new ranks ``len(keep)`` on."""
    reason: str = ""
    """Why the group restarts instead (empty when in place)."""

    @property
    def in_place(self) -> bool:
        return not self.reason

    @property
    def direction(self) -> str:
        return GROW if self.new_world > self.old_world else SHRINK

    @property
    def added(self) -> int:
        return len(self.bundles)

    def rank_map(self) -> dict[int, int | None]:
        """Old rank -> new rank (``None``: its worker is gone or stopped)."""
        new = {old: i for i, old in enumerate(self.keep)}
        return {old: new.get(old) for old in range(self.old_world)}

    def go_within_s(self, wait_s: float, start_s: float) -> float:
        """How long a kept worker waits, once it has left the running attempt, for the
        resized group (the go fact): the controller's own bounds in turn, every kept worker
        leaving (``wait_s``, ``HealthConfig(live_wait_s)``) and the group placed (``wait_s``
        again: a grow's new bundles; a shrink's workers dropped), plus, for a grow, its new
        workers' processes starting (``start_s``: as long as Ray Train gives a worker group
        to start). A new worker's process start on a loaded node is no reason to restart
        the whole group."""
        return 2 * wait_s + (start_s if self.added else 0.0)

    def event_fields(self) -> dict[str, Any]:
        """The ``resize`` event's fields."""
        return {"path": "live" if self.in_place else "restart", "direction": self.direction,
                "old_world_size": self.old_world, "new_world_size": self.new_world,
                "rank_map": {str(o): n for o, n in self.rank_map().items()},
                "lost_ranks": list(self.lost), "retired_ranks": list(self.retire),
                "added": self.added, **({} if self.in_place else {"fallback": self.reason})}


@dataclass(frozen=True)
class RankPlace:
    """A worker's place in the resized group, as Ray's distributed context holds it."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int

    def as_dict(self) -> dict[str, int]:
        return {"world_rank": self.world_rank, "world_size": self.world_size,
                "local_rank": self.local_rank, "local_world_size": self.local_world_size,
                "node_rank": self.node_rank}


def places(nodes: Sequence[str]) -> list[RankPlace]:
    """The place of each worker of a group whose rank ``r`` runs on ``nodes[r]``: local rank
    and local world size among the workers of its node, node rank in order of first
    appearance (as Ray computes them for a group without replica groups)."""
    sizes: dict[str, int] = {}
    for node in nodes:
        sizes[node] = sizes.get(node, 0) + 1
    order: dict[str, int] = {}
    seen: dict[str, int] = {}
    out = []
    for rank, node in enumerate(nodes):
        order.setdefault(node, len(order))
        local = seen.get(node, 0)
        seen[node] = local + 1
        out.append(RankPlace(rank, len(nodes), local, sizes[node], order[node]))
    return out


@dataclass(frozen=True)
class ResizeInput:
    """What the controller knows when the elastic policy chose ``new_world``."""

    old_world: int
    new_world: int
    failed: frozenset[int] = frozenset()
    """Ranks failed at the last poll (a shrink's lost workers)."""
    lost_only: bool = True
    """Every failed rank's node is gone (the shrink is the lost node's, not a rank's own
    failure)."""
    free_bundles: tuple[int, ...] = ()
    """Bundles of the group's placement group that no worker holds (a grow's places)."""
    live: bool = True
    elastic: bool = True
    live_attempt_failed: str | None = None
    """Why the running attempt, itself opened by a live recovery or resize, cannot be kept
    (it failed before its first commit); ``None``: it can."""


def plan_resize(given: ResizeInput) -> ResizePlan:
    """The resize of a running group from ``old_world`` to ``new_world`` workers. The first
    row that applies decides:

    ==  ====================================================  =======================
    #   when                                                  plan
    ==  ====================================================  =======================
    1   not live recovery, or not an elastic run              restart
    2   the running attempt is a live one that failed          restart (its reason)
    3   the same size                                         restart (not a resize)
    4   shrink: no rank failed, none on a lost or            restart
        quarantined node (the controller's ``failed``)
    5   shrink: a failed rank's node is not gone               restart
    6   shrink: fewer survivors than the new size             restart
    7   shrink                                                keep the lowest survivors
    8   grow while ranks failed                               restart
    9   grow past the free bundles                            restart
    10  grow                                                  keep all, add new ranks
    ==  ====================================================  =======================
    """
    old, new = given.old_world, given.new_world
    failed = tuple(sorted(r for r in given.failed if 0 <= r < old))

    def restart(why: str) -> ResizePlan:
        return ResizePlan(old, new, lost=failed, reason=why)

    if not given.live:
        return restart("live recovery is off (GuardConfig(recovery='restart'))")
    if not given.elastic:
        return restart("a fixed-size run is not resized")
    if given.live_attempt_failed:
        return restart(given.live_attempt_failed)
    if new == old:
        return restart(f"the elastic policy kept {old} workers: not a resize")
    if new < old:
        if not failed:
            return restart(f"the elastic policy shrinks {old} -> {new} with no worker on a "
                           "lost or quarantined node: the group restarts")
        if not given.lost_only:
            return restart(f"rank(s) {list(failed)} failed on nodes that are still up: "
                           "not a lost node")
        survivors = [r for r in range(old) if r not in set(failed)]
        if len(survivors) < new:
            return restart(f"{len(survivors)} survivor(s) cannot fill {new} ranks without "
                           "new workers")
        return ResizePlan(old, new, keep=tuple(survivors[:new]), lost=failed,
                          retire=tuple(survivors[new:]))
    if failed:
        return restart(f"rank(s) {list(failed)} failed while the group grows")
    need = new - old
    if len(given.free_bundles) < need:
        return restart(f"growing from {old} to {new} needs {need} free placement-group "
                       f"bundle(s), the group has {len(given.free_bundles)}")
    return ResizePlan(old, new, keep=tuple(range(old)),
                      bundles=tuple(sorted(given.free_bundles)[:need]))


def place_of(go: dict[str, Any] | None, rank: int) -> dict[str, int] | None:
    """This old rank's new place in a resize's go fact (``{"places": {old rank: place}}``,
    published by :mod:`rayguard.controller.resize`); ``None``: it has no place (stopped)."""
    return ((go or {}).get("places") or {}).get(str(rank))


def is_resize(notice: dict[str, Any] | None) -> bool:
    return bool((notice or {}).get("resize"))


def go_wait_s(notice: dict[str, Any] | None, wait_s: float) -> float:
    """A kept worker's wait for the go fact of the resize ``notice`` announces: the bound the
    controller wrote into it (:meth:`ResizePlan.go_within_s`), never below ``wait_s``
    (a notice without one: ``wait_s``)."""
    return bounded_wait_s(((notice or {}).get("resize") or {}).get("go_within_s"), wait_s)


__all__ = ["GROW", "SHRINK", "RankPlace", "ResizeInput", "ResizePlan", "go_wait_s",
           "is_resize", "place_of", "places", "plan_resize"]

