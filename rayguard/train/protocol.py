"""The checkpoint commit protocol as plain functions over a Collective and a CheckpointStore.

``save``, once every rank agreed that this step checkpoints (the caller's intent gather):

1. each rank writes its shard into the store's staging for the checkpoint, hashing while
   writing (``write_dcp``: torch.distributed.checkpoint first, then the plain shard), and the
   store uploads it where the filesystem is remote;
2. the shard records (files, sizes, digests, or the error) are gathered;
3. any failure: rank 0 discards the staging and every rank raises the same CheckpointError;
   else rank 0 writes the manifest last and publishes atomically (the commit).

``load``: rank 0 picks the newest checkpoint that verifies (rejections are recorded and never
tried again), every rank learns it through a gather and reads its own shard from a local copy.

A crash at any point leaves the committed checkpoints as they were plus, at most, the new one
whole; staging without a manifest is invisible to every reader and removed at the next load.
No Ray import: unit-tested with :class:`rayguard.testing.collective.ThreadGroup`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rayguard.checkpoint.manifest import ShardRecord
from rayguard.exceptions import CheckpointError
from rayguard.train.collective import Collective
from rayguard.train.store import CheckpointStore

logger = logging.getLogger("rayguard")

META = "__rayguard__"
"""The payload key of rayguard's own per-rank data (RNG state, whether a state was passed)."""

DcpWriter = Callable[[str, Any], tuple[ShardRecord, list[dict[str, Any]]]]
"""(local staging directory, payload) -> (this rank's record, the meshes found): a sharded
save's write step (a collective over the default process group)."""


class MemoryTier(Protocol):
    """The in-memory tier's hooks (:class:`rayguard.train.memory_tier.MemoryTier`)."""

    def enabled(self) -> bool:
        ...

    def offer(self, final: str, step: int, payload: Any, record: Any) -> None:
        """This rank's shard of ``final`` was written (``record`` may be the error)."""
        ...

    def committed(self, final: str, step: int) -> None:
        """Rank 0 committed ``final``."""
        ...

    def choose(self, skip: set[str]) -> str | None:
        """Rank 0: the newest checkpoint when memory holds it (its hashing is left to the
        ranks' memory copies), else None."""
        ...

    def prepare(self, chosen: str, choose_on_disk: Callable[[], str | None]
                ) -> tuple[str | None, dict[int, Any], dict[str, Any]]:
        """Every rank: (checkpoint to restore, payloads served from memory, event fields)."""
        ...


def checkpoint_name(step: int, attempt: int) -> str:
    return f"checkpoint_{step:09d}_a{attempt}"


def fresh_name(store: CheckpointStore, step: int, attempt: int) -> str:
    """The name a save of ``step`` in ``attempt`` publishes under: :func:`checkpoint_name`,
    or that name with ``.1``, ``.2``... when an earlier ``fit()`` of the same run directory
    left a directory of that name (it reached the step in an attempt of the same number: a
    sweep restarting its trial from an earlier checkpoint, a rerun after a driver died).
    Never the earlier one's place: a commit there is refused, and a rejection recorded
    against that path would hold against the new checkpoint. Every rank finds the same name:
    what makes a name taken (:meth:`CheckpointStore.taken`) shows only at a commit, and this
    save's own commit comes after every rank has written."""
    base = name = checkpoint_name(step, attempt)
    again = 0
    while store.taken(store.final_path(name)):
        again += 1
        name = f"{base}.{again}"
    return name


def make_payload(state: Any, rng: Any) -> dict[str, Any]:
    """What a rank writes: its state and rayguard's part (RNG state, whether it had a state)."""
    return {META: {"rng": rng, "has_state": state is not None}, "state": state}


@dataclass(frozen=True)
class Committed:
    """A checkpoint rank 0 published."""

    path: str
    step: int
    bytes: int
    shards: int


@dataclass(frozen=True)
class Restored:
    """What ``load`` read for this rank."""

    state: Any
    step: int | None
    path: str


def _write(collective: Collective, store: CheckpointStore, final: str, payload: Any,
           write_dcp: DcpWriter | None) -> tuple[Any, list[dict[str, Any]]]:
    """This rank's record (or the error, as a value every rank will see) and the meshes."""
    from rayguard.checkpoint.writer import write_shard

    meshes: list[dict[str, Any]] = []
    try:
        with store.stage(final) as staged:
            if write_dcp is not None:
                record, meshes = write_dcp(staged, payload)
            else:
                record = write_shard(staged, collective.rank, payload)
            store.upload(staged, final, record)
        return record, meshes
    except Exception as exc:
        return CheckpointError(f"rank {collective.rank} on node {collective.node}: {exc}"), meshes


def save(collective: Collective, store: CheckpointStore, payload: Any, *, step: int,
         attempt: int, tag: str, write_dcp: DcpWriter | None = None,
         dcp_keys: list[str] | None = None, started: float | None = None,
         tier: MemoryTier | None = None, **event: Any) -> Committed | None:
    """Every rank: write, gather the records, rank 0 commits. Returns the checkpoint on rank 0
    (``None`` elsewhere); raises CheckpointError on every rank when any rank failed to write.
    ``event``: extra fields for the ``checkpoint_committed`` event."""
    started = time.perf_counter() if started is None else started
    name = fresh_name(store, step, attempt)
    final = store.final_path(name)
    record, meshes = _write(collective, store, final, payload, write_dcp)
    if write_dcp is not None:
        collective.progress()
    elif tier is not None:  # the shard was written: keep a copy in memory
        tier.offer(final, step, payload, record)
    records = collective.gather(f"{tag}:records", record, root=0)  # the others: errors only
    failures = [r for r in records if isinstance(r, BaseException)]
    if failures:
        if collective.rank == 0:
            store.discard(final)
        raise CheckpointError(
            f"checkpoint of step {step} was not saved (earlier checkpoints are intact): "
            + "; ".join(str(f) for f in failures))
    if collective.rank != 0:
        return None
    metadata: dict[str, Any] = {"attempt": attempt}
    if write_dcp is not None:
        _describe_sharded(store, final, records, meshes, dcp_keys or [], collective.world_size,
                          metadata)
    path = store.commit(final, records, world_size=collective.world_size, step=step,
                       metadata=metadata)
    if tier is not None:  # its memory copies become the servable ones
        tier.committed(final, step)
    total = sum(f.size_bytes for r in records for f in r.files)
    seconds = round(time.perf_counter() - started, 6)
    collective.record("checkpoint_committed", f"checkpoint {name} committed ({total} bytes, "
                      f"{len(records)} shard(s))", step=step, path=final, bytes=total,
                      seconds=seconds, **{"blocked_s": seconds, **event})  # in the loop: all of it
    return Committed(path, step, total, len(records))


def _describe_sharded(store: CheckpointStore, final: str, records: list[ShardRecord],
                      meshes: list[dict[str, Any]], keys: list[str], world_size: int,
                      metadata: dict[str, Any]) -> None:
    """Rank 0 of a sharded save: the records must cover DCP's directory exactly (its
    ``.metadata`` there, each file owned by one rank); describe the sharded part."""
    from rayguard.checkpoint import sharded as sh

    dcp_records = [f for r in records for f in r.files if f.path.startswith(f"{sh.DCP_DIR}/")]
    try:
        sh.check_complete(dcp_records, store.staged_names(final, sh.DCP_DIR), world_size)
    except BaseException:
        store.discard(final)
        raise
    metadata[sh.SHARDED_KEY] = sh.describe_sharded(world_size, meshes, keys)


# -- load ----------------------------------------------------------------------------------

def reject(collective: Collective, store: CheckpointStore, path: str, why: str) -> None:
    """Remember that ``path`` must never be resumed from (event log, store, the run)."""
    collective.record("checkpoint_rejected", f"skipped {why}", path=path)
    store.remember_rejection(path, why)
    collective.share_rejection(path, why)


def rejected(collective: Collective, store: CheckpointStore) -> set[str]:
    return set(store.rejected()) | set(collective.shared_rejections())


def choose(collective: Collective, store: CheckpointStore,
           tier: MemoryTier | None = None) -> str | None:
    """Rank 0: the newest checkpoint that verifies; rejections are recorded and remembered.
    Staging left by saves that never finished is removed first."""
    store.cleanup()
    skip = rejected(collective, store)
    held = tier.choose(skip) if tier is not None else None
    if held is not None:  # the ranks verify their memory copies instead
        return held
    chosen, rejections = store.choose(skip)
    for path, why in rejections:
        reject(collective, store, path, why)
    return chosen


def load(collective: Collective, store: CheckpointStore, *, tag: str,
         previous_rank: int | None = None, tier: MemoryTier | None = None,
         on_chosen: Callable[[str | None], None] | None = None) -> Restored | None:
    """Every rank: this rank's state from the newest checkpoint that verifies (``None``: there
    is none). RNG states saved with it are restored. ``tier``: the in-memory tier serves the
    shards it holds copies of that verify. ``on_chosen(path)`` is told the checkpoint before
    it is read (a read that fails on every attempt is then known to be this one's). The
    ``restored`` event says how long it took (``load_s``: choosing, verifying and reading)."""
    started = time.monotonic()
    chosen = choose(collective, store, tier) if collective.rank == 0 else None
    chosen = collective.gather(tag, chosen)[0]
    collective.progress()
    if on_chosen is not None:
        on_chosen(chosen)
    if chosen is None:
        return None
    memory: dict[int, Any] | None = None
    fields: dict[str, Any] = {"tier": "disk"}
    if tier is not None and tier.enabled():
        found, memory, fields = tier.prepare(chosen, lambda: choose(collective, store, tier))
        if found is None:
            return None
        chosen = found
    with store.materialize(chosen) as local:
        return read_state(collective, chosen, local, previous_rank=previous_rank,
                          memory=memory, started=started, **fields)


def _warn_unloaded_sharded(manifest: Any, chosen: str) -> None:
    from rayguard.checkpoint.sharded import sharded_info

    info = sharded_info(manifest)
    if info is not None:
        logger.warning("rayguard: %s also holds sharded state %s that load_state() without "
                       "sharded= does not load. Fix: load_state(sharded={...}) with the objects "
                       "passed to report(sharded=...)", chosen, info.get("keys"))


def read_state(collective: Collective, chosen: str, local: str, *,
               previous_rank: int | None = None, plain_optional: bool = False, note: str = "",
               memory: dict[int, Any] | None = None, started: float | None = None,
               **extra: Any) -> Restored:
    """Read this rank's state from ``local`` (a verified checkpoint, maybe a download): the
    point where a shard is read.

    ``plain_optional``: the sharded part was loaded; a checkpoint without plain state
    returns ``{}`` instead of raising. ``note`` and ``extra`` go into the ``restored`` event.
    ``memory``: payloads by saved rank already read and verified from the memory tier.
    ``started``: when the load began (monotonic), for the event's ``load_s``."""
    from pathlib import Path

    from rayguard import checkpoint as ck
    from rayguard.checkpoint import reader

    def read_shard(directory: str, rank: int) -> Any:
        return memory[rank] if memory and rank in memory else reader.read_shard(directory, rank)

    rank, world_size = collective.rank, collective.world_size
    manifest = ck.read_manifest(Path(local))
    if not plain_optional and rank == 0:
        _warn_unloaded_sharded(manifest, chosen)
    # Same world size: a rank's own shard. After a resize, rank-local state follows the
    # worker (the rank its slot held before); replicated state comes from rank 0 below.
    source = rank if manifest.world_size == world_size else previous_rank
    own = read_shard(local, source) if source is not None and manifest.shard_files_of(source) else None
    meta = (own or {}).get(META, {})
    if own is not None and meta.get("has_state"):
        state = own["state"]
    else:
        shared = read_shard(local, 0) if manifest.shard_files_of(0) else None
        if (shared is None or not shared.get(META, {}).get("has_state")) and plain_optional:
            shared = {META: {"has_state": True}, "state": {}}
        if shared is None or not shared.get(META, {}).get("has_state"):
            raise CheckpointError(
                f"rank {rank}: checkpoint {chosen} has no state for this rank and no "
                "replicated state from rank 0. Fix: pass state= on rank 0 (replicated) or on "
                "every rank (sharded), with the same world size.")
        state = shared["state"]
    if own is not None and "rng" in meta:
        ck.restore_rng_state(meta["rng"])
    step = state.get("step") if isinstance(state, dict) else None
    if step is None and plain_optional:
        step = manifest.step
    step = step if isinstance(step, int) else None
    if started is not None:
        extra["load_s"] = round(time.monotonic() - started, 3)
    if rank == 0:
        collective.record("restored", f"restored {os.path.basename(chosen)} (step {step}){note}",
                          step=step, path=chosen, **extra)
    return Restored(state, step, chosen)
