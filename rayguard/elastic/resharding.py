"""Which saved rank's state each new rank loads after a resize (pure).

Three kinds of per-rank state:

``"replicated"``
    Identical on every rank (DDP model and optimizer, the sampler state). Any saved copy
    loads anywhere: a new rank takes its own previous rank's copy when that was saved,
    else the lowest saved rank's.
``"rank_local"``
    Belongs to one rank (its RNG state, a per-rank buffer). It follows the remapping: new
    rank ``r`` loads what ``previous_rank[r]`` saved. A new worker has no such state:
    ``missing="error"`` (default) refuses, ``missing="fresh"`` leaves it out of the plan
    so that the caller initialises it anew. State of ranks that did not survive is dropped.
``"sharded"``
    A partition of one object over exactly ``saved_world_size`` ranks (ZeRO/FSDP shards
    saved per rank). It cannot be resharded here: loading needs the same world size and
    every shard, and new rank ``r`` loads shard ``r``; anything else is a clear error.
    State passed through ``report(sharded=...)`` is not planned here: it is written with
    torch.distributed.checkpoint and resharded by it on load (``load_state(sharded=...)``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from rayguard.elastic.remap import RankAssignment
from rayguard.exceptions import CheckpointError

StateKind = Literal["replicated", "rank_local", "sharded"]


class ReshardError(CheckpointError):
    """Saved per-rank state cannot be mapped onto the new ranks."""


def plan_state_sources(
    saved_world_size: int,
    saved_ranks: Collection[int],
    new_assignment: RankAssignment | Sequence[int | None],
    kind: StateKind = "replicated",
    *,
    missing: Literal["error", "fresh"] = "error",
) -> dict[int, int]:
    """``{new_rank: saved_rank}``: the saved state each new rank loads.

    ``saved_ranks`` are the ranks whose state is present in the checkpoint (of a world of
    ``saved_world_size``); ``new_assignment`` is this attempt's :class:`RankAssignment` (or
    just its ``previous_rank`` list: one entry per new rank). Raises :class:`ReshardError` naming the ranks and the fix.
    """
    previous_rank = (new_assignment.previous_rank if isinstance(new_assignment, RankAssignment)
                     else list(new_assignment))
    saved = sorted(set(saved_ranks))
    if any(not 0 <= r < saved_world_size for r in saved):
        raise ReshardError(f"plan_state_sources: saved ranks {saved[:8]} fall outside "
                           f"[0, saved_world_size={saved_world_size}). Fix: pass the checkpoint's ranks")
    if not saved:
        raise ReshardError(f"plan_state_sources(kind={kind!r}): the checkpoint holds no per-rank state. "
                           "Fix: save it from at least rank 0")
    new_world = len(previous_rank)
    if kind == "replicated":
        have = set(saved)
        return {r: (p if p is not None and p in have else saved[0]) for r, p in enumerate(previous_rank)}
    if kind == "rank_local":
        return _plan_rank_local(saved, previous_rank, missing)
    if kind == "sharded":
        if new_world != saved_world_size or saved != list(range(saved_world_size)):
            raise ReshardError(
                f"plan_state_sources(kind='sharded'): state sharded over {saved_world_size} ranks "
                f"(shards present: {len(saved)}) cannot load into {new_world} ranks. Fix: keep the "
                "world size fixed for this state, or pass it through rayguard.train.report("
                "sharded=...) / load_state(sharded=...), which DCP reshards")
        return {r: r for r in range(new_world)}
    raise ReshardError(f"plan_state_sources(kind={kind!r}): unknown kind. "
                       "Fix: pass 'replicated', 'rank_local' or 'sharded'")


def _plan_rank_local(saved: list[int], previous_rank: Sequence[int | None],
                     missing: Literal["error", "fresh"]) -> dict[int, int]:
    have = set(saved)
    plan: dict[int, int] = {}
    orphans: list[int] = []
    for r, p in enumerate(previous_rank):
        if p is not None and p in have:
            plan[r] = p
        else:
            orphans.append(r)
    if orphans and missing == "error":
        raise ReshardError(
            f"plan_state_sources(kind='rank_local'): new ranks {orphans[:8]} have no saved "
            "rank-local state (new workers, or their previous rank saved none). Fix: pass "
            "missing='fresh' and initialise that state anew on those ranks, or store it as "
            "'replicated'")
    return plan
