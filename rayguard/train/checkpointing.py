"""Coordinated checkpoints inside a worker: ``report(state=...)`` and ``load_state()``.

The session-side adapter of the commit protocol (:mod:`rayguard.train.protocol`): every rank
first says whether it has a state at this step (the intent gather, in the training loop, so
that every rank snapshots its RNG at the same step); if any has, the protocol runs over the
run's :class:`~rayguard.train.collective.Collective` and
:class:`~rayguard.train.store.CheckpointStore`:

1. each rank writes its shard into the store's staging, hashing while writing; ranks
   without a state write only their RNG state (a few KiB) so the run resumes exactly;
2. the shard records (files, sizes, digests, or the error) are gathered; rank 0 writes the
   manifest last and atomically, then publishes (the commit);
3. rank 0 hands the committed directory to ``ray.train.report`` (no upload: it is already
   in the run directory), so ``CheckpointConfig(num_to_keep=...)`` and ``Result`` work.

With ``sharded=`` (every rank passes it), step 1 first runs ``torch.distributed.checkpoint``
into the staging's ``dcp/`` (a collective), then each rank hashes the DCP files it wrote
and adds them to its shard record; rank 0 also checks that no DCP file escaped the records.
``load_state(sharded=...)`` lets DCP read only a checkpoint rank 0 verified in full.

A crash at any moment leaves either a committed, verified checkpoint or a staging directory
that no reader accepts and the next start removes. This module does not import the session:
the checkpointer (:mod:`rayguard.train.checkpointer`) passes its collective, store and context.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from rayguard.exceptions import CheckpointError, ShardedStateError
from rayguard.train.protocol import (
    Committed,
    Restored,
    checkpoint_name,
    load,
    make_payload,
    read_state,
    save,
)

if TYPE_CHECKING:
    from rayguard.train.collective import Collective
    from rayguard.train.protocol import MemoryTier
    from rayguard.train.store import CheckpointStore

logger = logging.getLogger("rayguard")

__all__ = ["Plan", "ShardedStateError", "agree_intent", "checkpoint_name", "load_state",
           "maybe_checkpoint", "read_state", "save_planned", "snapshot_payload"]


def _canonical_keys(state: Any) -> Any:
    """Strip DDP/compile wrapper prefixes (``module.``) from the state dicts in ``state``, so a
    state saved from a wrapped model loads into an unwrapped one; for a wrapped target use
    ``rayguard.checkpoint.normalize_state_dict_keys(sd, like=model.state_dict())``."""
    from rayguard.checkpoint import normalize_state_dict_keys
    from rayguard.checkpoint.keys import WRAPPER_PREFIXES

    if not isinstance(state, dict):
        return state
    out = {}
    for key, value in state.items():
        if (isinstance(value, dict) and value and all(isinstance(k, str) for k in value)
                and any(k.startswith(WRAPPER_PREFIXES) for k in value)):
            value = normalize_state_dict_keys(value)
        out[key] = value
    return out


class _Intent(NamedTuple):
    has_state: bool
    step: int
    sharded: bool
    problem: str | None
    facts: Any = None
    """The model preflight's facts, at the first report only."""


def _problem(rank: int, state: Any, sharded: Any) -> str | None:
    """What is wrong with ``sharded=`` on this rank (a DTensor in ``state=`` was refused by
    ``report`` before any peer waits: :func:`rayguard.checkpoint.checkpointable.check_checkpointable`)."""
    if sharded is not None:
        from rayguard.train.sharded import check_sharded_arg

        problem = check_sharded_arg(sharded)
        return None if problem is None else f"rank {rank}: {problem}"
    return None


def _agree(intents: list[_Intent]) -> None:
    """Raise the same ShardedStateError on every rank when any rank misused the arguments."""
    problems = [i.problem for i in intents if i.problem]
    if problems:
        raise ShardedStateError("; ".join(problems))
    flags = [i.sharded for i in intents]
    if any(flags) and not all(flags):
        raise ShardedStateError(
            f"ranks {[r for r, f in enumerate(flags) if not f]} did not pass sharded= while ranks "
            f"{[r for r, f in enumerate(flags) if f]} did: the sharded save is a collective. Fix: "
            "call report(..., sharded=...) with the same keys on every rank.")


@dataclass(frozen=True)
class Plan:
    """What every rank agreed at a report: save a checkpoint of ``step``."""

    step: int
    sharded: bool
    tag: str
    started: float


def agree_intent(collective: Collective, state: Any, step: int, sharded: Any,
                 report_count: int) -> Plan | None:
    """Every rank: does any rank have a state at this report? (one gather; the misuse of
    ``state=``/``sharded=`` raises the same ShardedStateError on every rank).
    ``None``: nothing to save."""
    started = time.perf_counter()
    tag = f"report{report_count}"
    first = report_count == 1
    facts = None
    if first:
        from rayguard.train.model_preflight import collect

        facts = collect(state, sharded)
    intent = _Intent(state is not None, step, sharded is not None,
                     _problem(collective.rank, state, sharded), facts)
    intents = [_Intent(*i) for i in collective.gather(f"{tag}:intent", tuple(intent))]
    _agree(intents)
    if first and collective.rank == 0:
        from rayguard.train.model_preflight import log_findings

        log_findings([i.facts for i in intents])
    if not any(i.has_state or i.sharded for i in intents):
        return None
    return Plan(intents[0].step, intents[0].sharded, tag, started)


def snapshot_payload(state: Any) -> dict[str, Any]:
    """This rank's payload with the RNG state of now (the state itself as it is)."""
    from rayguard import checkpoint as ck

    return make_payload(_canonical_keys(state), ck.capture_rng_state())


def save_planned(collective: Collective, store: CheckpointStore, plan: Plan, payload: Any, *,
                 attempt: int, sharded: Any = None, tier: MemoryTier | None = None,
                 **event: Any) -> Committed | None:
    """Run the commit protocol for ``plan`` (every rank)."""
    write_dcp = None
    if plan.sharded:
        from rayguard.train.sharded import write_rank

        def write_dcp(staged: str, payload: Any) -> Any:
            return write_rank(staged, collective.rank, sharded, payload)

    return save(collective, store, payload, step=plan.step, attempt=attempt, tag=plan.tag,
                write_dcp=write_dcp, dcp_keys=sorted(sharded) if plan.sharded else None,
                started=plan.started, tier=tier, **event)


def maybe_checkpoint(collective: Collective, store: CheckpointStore, state: Any, step: int,
                     sharded: Any, *, report_count: int, attempt: int,
                     tier: MemoryTier | None = None) -> Committed | None:
    """Run the commit protocol if any rank passed a state; returns the committed checkpoint
    on rank 0 (``None`` on other ranks or when nothing was saved)."""
    plan = agree_intent(collective, state, step, sharded, report_count)
    if plan is None:
        return None
    return save_planned(collective, store, plan, snapshot_payload(state), attempt=attempt,
                        sharded=sharded, tier=tier)


def load_state(collective: Collective, store: CheckpointStore, sharded: Any, *,
               load_count: int, previous_rank: int | None,
               tier: MemoryTier | None = None,
               on_chosen: Callable[[str | None], None] | None = None) -> Restored | None:
    """``rayguard.train.load_state()``: the newest checkpoint that verifies, for this rank
    (``on_chosen(path)``: told which one before it is read)."""
    problem = None
    if sharded is not None:
        from rayguard.train.sharded import check_sharded_arg

        problem = check_sharded_arg(sharded)
    tag = f"load{load_count}"
    answers = collective.gather(f"{tag}:args", (sharded is not None, problem))
    _agree([_Intent(False, 0, has, p) for has, p in answers])
    if sharded is None:
        return load(collective, store, tag=tag, previous_rank=previous_rank, tier=tier,
                    on_chosen=on_chosen)
    return _load_sharded(collective, store, sharded, tag, previous_rank, on_chosen)


def _load_sharded(collective: Collective, store: CheckpointStore, sharded: Any, tag: str,
                  previous_rank: int | None,
                  on_chosen: Callable[[str | None], None] | None) -> Restored | None:
    """The newest sharded checkpoint that verifies; one whose DCP data fails while it is
    read (:func:`~rayguard.train.sharded.restore` returns a ReadRejection) is rejected and
    the next older one loaded over it. When none is left after a rejection that had copied
    verified bytes into the state, the state is neither fresh nor a checkpoint's, so the
    attempt fails (retried: the next attempt starts from a fresh model, skipping the
    rejected checkpoints)."""
    from rayguard.train.sharded import ReadRejection, choose, restore

    partly_loaded, round_ = None, 0
    while True:
        sub = tag if round_ == 0 else f"{tag}.{round_}"
        round_ += 1
        verified = choose(collective, store, sub)
        collective.progress()
        if verified is None and partly_loaded is not None:
            raise CheckpointError(
                f"rank {collective.rank}: no sharded checkpoint verifies, and the sharded state "
                f"was partly loaded from {partly_loaded} (verified bytes only) before a "
                "corrupt chunk was found in it. Fix: nothing; the restart starts from a fresh "
                "model (the corrupt checkpoints are remembered as rejected)")
        if on_chosen is not None:
            on_chosen(None if verified is None else verified[0])
        if verified is None:
            return None
        restored = restore(collective, store, verified, sharded, previous_rank=previous_rank,
                           tag=sub)
        if not isinstance(restored, ReadRejection):
            return restored  # type: ignore[no-any-return]
        if restored.touched:
            partly_loaded = restored.path
