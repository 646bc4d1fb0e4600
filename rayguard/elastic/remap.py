"""Rank remapping across resizes: a pure policy over worker identities.

A *worker identity* is the slot a worker occupies, ``WorkerSlot(node_id, local_index,
gpu_ids)``: the same node and GPU(s) in two attempts are the same slot, whatever Ray actor
runs there. The policy:

1. **First attempt** (no previous assignment): ranks are contiguous and follow node order
   (the order in which nodes first appear in the given worker list; pass workers in Ray's
   world-rank order and the ranks equal Ray's), then, within a node, the lowest GPU id, then
   ``local_index``.
2. **After a resize**: *survivors* (slots present in both attempts) keep their relative
   order and stay at their previous rank when it still fits; survivor ``i`` (0-based, in
   previous-rank order) of ``S`` gets ``min(previous_rank_i, world_size - S + i)``, which
   is strictly increasing, so order is kept and ranks are shifted down only as far as the
   smaller world forces. *New* workers then fill the lowest free ranks, in the order of
   rule 1.

Ranks are always exactly ``0 .. world_size - 1``. The result says, per new rank, which rank
the same slot held before (``previous_rank``, ``None`` for a new worker) so that rank-local
state can follow (:mod:`rayguard.elastic.resharding`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from rayguard.exceptions import ConfigError


class WorkerSlot(NamedTuple):
    """Where a worker runs: the identity that survives a restart of its actor.

    A named tuple (hashing and comparison in C: the planner does O(n) lookups at 4096 ranks).
    """

    node_id: str
    """Ray node id (hex) of the node the worker runs on."""

    local_index: int = 0
    """Index of the worker among those on its node (Ray's ``local_rank`` is fine)."""

    gpu_ids: tuple[int, ...] = ()
    """GPU ids the worker holds on its node; empty on CPU."""


@dataclass(frozen=True)
class RankAssignment:
    """The outcome of one planning: new ranks and where each came from."""

    ranks: dict[WorkerSlot, int]
    """New rank of every worker of this attempt."""

    previous_rank: list[int | None]
    """Indexed by new rank: the rank the same slot held in the previous attempt, or ``None``."""

    world_size: int
    """Number of workers in this attempt."""

    previous_world_size: int | None
    """Number of workers in the previous attempt (``None`` on the first attempt)."""

    world_size_changed: bool
    """``True`` when a previous attempt exists and had a different size."""

    slots: list[WorkerSlot] = field(default_factory=list)
    """Indexed by new rank: the slot holding that rank."""

    def to_state(self) -> dict[str, int]:
        """Plain, checkpointable form of ``ranks`` (``"node_id/local_index/gpu,ids" -> rank``)."""
        return {slot_key(s): r for s, r in self.ranks.items()}


def slot_key(slot: WorkerSlot) -> str:
    """Stable string form of a slot, for checkpoints and logs."""
    return f"{slot.node_id}/{slot.local_index}/{','.join(map(str, slot.gpu_ids))}"


def slot_from_key(key: str) -> WorkerSlot:
    """Inverse of :func:`slot_key`."""
    try:
        node_id, local, gpus = key.rsplit("/", 2)
        return WorkerSlot(node_id, int(local), tuple(int(g) for g in gpus.split(",") if g))
    except ValueError:
        raise ConfigError(f"slot_from_key({key!r}): not a 'node_id/local_index/gpu_ids' key. "
                          "Fix: pass a key written by rayguard.elastic.remap.slot_key") from None


def assignment_from_state(state: Mapping[str, int]) -> dict[WorkerSlot, int]:
    """Inverse of :meth:`RankAssignment.to_state` (what the previous attempt checkpointed)."""
    return {slot_from_key(k): int(r) for k, r in state.items()}


def slots_from_workers(workers: Sequence[tuple[str, Sequence[int]]]) -> list[WorkerSlot]:
    """Slots for workers given as ``(node_id, gpu_ids)`` in Ray world-rank order.

    ``local_index`` is the worker's position among the workers of its node id, ordered by
    lowest GPU id then world rank. Use this rather than Ray's ``local_rank``, which groups
    by node IP (all simulated nodes of a ``ray.cluster_utils.Cluster`` share one IP).
    """
    by_node: dict[str, list[tuple[int, int]]] = {}
    for i, (node_id, gpus) in enumerate(workers):
        by_node.setdefault(node_id, []).append((min(gpus) if gpus else -1, i))
    local: dict[int, int] = {}
    for members in by_node.values():
        for li, (_, i) in enumerate(sorted(members)):
            local[i] = li
    return [WorkerSlot(node_id, local[i], tuple(int(g) for g in gpus))
            for i, (node_id, gpus) in enumerate(workers)]


def initial_order(workers: Sequence[WorkerSlot]) -> list[WorkerSlot]:
    """Rule 1: node in first-appearance order, then lowest GPU id, then ``local_index``."""
    node_order: dict[str, int] = {}
    for w in workers:
        node_order.setdefault(w.node_id, len(node_order))

    def key(w: WorkerSlot) -> tuple[int, int, int]:
        return (node_order[w.node_id], min(w.gpu_ids) if w.gpu_ids else -1, w.local_index)

    return sorted(workers, key=key)


def _check_workers(workers: Sequence[WorkerSlot]) -> None:
    if not workers:
        raise ConfigError("plan_ranks(workers=[]): no workers to assign ranks to. "
                          "Fix: pass the workers of the new attempt")
    if len(set(workers)) != len(workers):
        dup = sorted(slot_key(w) for w, c in Counter(workers).items() if c > 1)
        raise ConfigError(f"plan_ranks(workers=...): duplicate worker slots {dup[:5]}. "
                          "Fix: give each worker a distinct (node_id, local_index)")


def _check_previous(previous: Mapping[WorkerSlot, int]) -> None:
    if set(previous.values()) != set(range(len(previous))):
        ranks = sorted(previous.values())
        raise ConfigError(f"plan_ranks(previous=...): previous ranks {ranks[:8]}... are not "
                          f"0..{len(ranks) - 1}. Fix: pass the assignment saved by the previous "
                          "attempt (RankAssignment.ranks)")


def plan_ranks(
    workers: Sequence[WorkerSlot], previous: Mapping[WorkerSlot, int] | None = None
) -> RankAssignment:
    """Assign contiguous ranks to ``workers`` following the module's policy.

    ``previous`` is the previous attempt's ``slot -> rank`` (``None`` or empty on the
    first attempt). O(n log n) in the number of workers.
    """
    _check_workers(workers)
    n = len(workers)
    ordered = initial_order(workers)
    if not previous:
        return RankAssignment(
            ranks={w: r for r, w in enumerate(ordered)}, previous_rank=[None] * n,
            world_size=n, previous_world_size=None, world_size_changed=False, slots=ordered)
    _check_previous(previous)
    get = previous.get
    survivors = sorted(((p, w) for w in workers if (p := get(w)) is not None), key=lambda pw: pw[0])
    s = len(survivors)
    slots: list[WorkerSlot | None] = [None] * n
    prev_rank: list[int | None] = [None] * n
    for i, (p, w) in enumerate(survivors):
        r = min(p, n - s + i)
        slots[r] = w
        prev_rank[r] = p
    newcomers = iter([w for w in ordered if w not in previous])
    for r in range(n):
        if slots[r] is None:
            slots[r] = next(newcomers)
    final = [w for w in slots if w is not None]
    return RankAssignment(
        ranks={w: r for r, w in enumerate(final)}, previous_rank=prev_rank, world_size=n,
        previous_world_size=len(previous), world_size_changed=len(previous) != n, slots=final)


def remap_permutation(workers: Sequence[WorkerSlot],
                      previous: Mapping[WorkerSlot, int]) -> list[int]:
    """:func:`plan_ranks` as a permutation of ``workers``: new rank ``r`` goes to
    ``workers[perm[r]]`` (what a controller hook applies to Ray's worker list)."""
    index = {slot: i for i, slot in enumerate(workers)}
    return [index[slot] for slot in plan_ranks(workers, previous).slots]


ASSIGNMENT_KEY = "elastic_assignment"
"""The run coordinator's key for the rank-assignment record, ``{"previous": state | None,
"current": state}`` with each state a :meth:`RankAssignment.to_state` mapping. The one
source of truth for the previous attempt's ranks: written only by the controller's
rank-order hook, before the workers of an attempt learn their ranks; read by the workers."""


def next_record(record: Mapping[str, object] | None, current: Sequence[WorkerSlot]) -> dict:
    """The record after an attempt whose ranks are ``current`` (indexed by rank)."""
    previous = record.get("current") if record else None
    return {"previous": previous, "current": {slot_key(s): r for r, s in enumerate(current)}}


def previous_rank_of(record: Mapping[str, object] | None, rank: int) -> tuple[int | None, int | None]:
    """``(rank the same slot held in the previous attempt, previous world size)`` for the
    worker with ``rank`` in the current attempt; ``(None, None)`` on a first attempt."""
    if not record or not record.get("previous"):
        return None, None
    previous = dict(record["previous"])  # type: ignore[call-overload]
    key = {r: k for k, r in dict(record["current"]).items()}.get(rank)  # type: ignore[call-overload]
    return (previous.get(key) if key is not None else None), len(previous)
