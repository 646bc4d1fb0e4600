"""The in-memory checkpoint tier, inside a worker (``CheckpointConfig(memory_tier=True)``).

Save: once a rank's shard is written, the rank packs the same bytes in memory
(:func:`~rayguard.checkpoint.memory.pack_shard`) and hands them to the *keeper* of its node, a
small actor created and owned by the run's coordinator, which ``ray.put``s them: the copy
lives in that node's object store, owned by a process that outlives the worker group (Ray
2.56 removed ``ray.put(_owner=)``, hence one keeper per node). A background thread then
registers the keeper's reference, with the shard's digests, with the coordinator. Rank 0
tells the coordinator when the checkpoint committed; only then is the copy servable, and the
previous one is freed.

Load: rank 0 still picks the checkpoint on disk. When the newest checkpoint on disk is the one
held in memory, rank 0 checks its manifest and file sizes but does not hash its files
(:func:`choose`); every rank then fetches the shard(s) it needs from memory and hashes them
against the manifest while decoding (:func:`prepare`). If any rank's copy is missing or does
not verify, rank 0 verifies the checkpoint on disk in full as before, and the ranks whose copy
failed read from disk.

Nothing here may fail a save or a load: any error of the memory tier means "read the disk".
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayguard.train.session import WorkerSession

logger = logging.getLogger("rayguard")

FETCH_TIMEOUT_S = 120.0
"""Longest wait for a memory copy (a lost node answers with an error well before)."""

_META = "__rayguard__"
_keepers: dict[str, Any] = {}
_pending: list[Future[None]] = []
_executor: ThreadPoolExecutor | None = None
_deferred: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_no_defer: weakref.WeakSet[Any] = weakref.WeakSet()


class MemoryKeeper:
    """Actor body: one per node, created by the coordinator. It owns the memory copies."""

    def hold(self, files: dict[str, Any]) -> list[Any]:
        """Copy ``files`` into this node's object store; the reference comes back in a list
        (so that it is passed on, not resolved)."""
        import ray

        return [ray.put(files)]

    def ping(self) -> bool:
        return True


def start_keeper(node_id: str) -> Any:
    """A keeper on ``node_id`` (called in the coordinator, which thereby owns it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(MemoryKeeper).options(
        num_cpus=0, max_concurrency=4,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()


def enabled(session: WorkerSession) -> bool:
    from rayguard.checkpoint.remote import is_local

    return (session.guard.checkpoint.memory_tier and session.coordinator is not None
            and is_local(session.fs))


# -- save -------------------------------------------------------------------------------------
def offer(session: WorkerSession, final: str, step: int, payload: Any, record: Any) -> None:
    """This rank's shard of ``final`` was written: keep a copy in memory (blocks only for
    one copy of the state into the object store; registration runs in the background)."""
    if not enabled(session) or isinstance(record, BaseException):
        return
    import ray

    from rayguard.checkpoint.memory import digests_of, pack_shard

    global _executor
    ctx = session.ctx
    try:
        _wait_pending()  # at most one offer in flight per process
        keeper = _keeper(session)
        files = pack_shard(ctx.rank, payload)
        held = keeper.hold.remote(files)  # the bytes are in the object store when this returns
        del files
        coordinator, digests = session.coordinator, digests_of(record)

        def register() -> None:
            refs = ray.get(held, timeout=FETCH_TIMEOUT_S)
            ray.get(coordinator.memory_offer.remote(final, step, ctx.rank, ctx.node_id, digests,
                                                    refs), timeout=FETCH_TIMEOUT_S)

        _executor = _executor or ThreadPoolExecutor(1, thread_name_prefix="rg-memory-tier")
        _pending.append(_executor.submit(register))
    except Exception as exc:
        logger.warning("rayguard: rank %d: no memory copy of %s (%s); a restart reads the disk",
                       ctx.rank, final, exc)


def committed(session: WorkerSession, final: str, step: int) -> None:
    """Rank 0: ``final`` committed; its memory copies become the servable ones."""
    if enabled(session):
        session.coordinator.memory_commit.remote(final, step)


def _keeper(session: WorkerSession) -> Any:
    import ray

    node = session.ctx.node_id
    if node not in _keepers:
        _keepers[node] = ray.get(session.coordinator.memory_keeper.remote(node),
                                 timeout=FETCH_TIMEOUT_S)
    return _keepers[node]


def _wait_pending() -> None:
    while _pending:
        future = _pending.pop(0)
        try:
            future.result(timeout=FETCH_TIMEOUT_S)
        except Exception as exc:
            logger.warning("rayguard: a memory copy was not registered (%s); a restart after "
                           "it reads the disk", exc)


def flush() -> None:
    """Wait for the background registration (tests, benchmarks, end of a worker)."""
    _wait_pending()


# -- load -------------------------------------------------------------------------------------
def choose(session: WorkerSession, skip: set[str]) -> str | None:
    """Rank 0: the newest checkpoint on disk when it is the one held in memory and its manifest
    and file sizes check out (its hashing is left to the ranks' memory copies); else None."""
    if not enabled(session) or session in _no_defer:
        return None
    import ray

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.fallback import candidates_of, order_candidates

    try:
        held = ray.get(session.coordinator.memory_committed.remote(), timeout=FETCH_TIMEOUT_S)
    except Exception as exc:
        logger.debug("rayguard: memory tier unavailable: %s", exc)
        return None
    if held is None:
        return None
    import os

    skipped = {os.path.realpath(p) for p in skip}
    newest = next((c for c in order_candidates(candidates_of(session.ctx.run_dir))
                   if os.path.realpath(c.path) not in skipped), None)
    if newest is None or str(newest.path) != held:
        return None
    if not ck.verify(held, hashes=False).ok:  # manifest parses, paths inside, sizes right
        return None
    _deferred[session] = held
    return held


def prepare(session: WorkerSession, chosen: str,
            choose_on_disk: Callable[[WorkerSession], str | None]
            ) -> tuple[str | None, dict[int, Any], dict[str, Any]]:
    """Every rank: fetch and verify the shard(s) this rank restores from memory; agree.

    Returns (checkpoint to restore, ``{saved rank: decoded payload}`` served from memory,
    fields for the ``restored`` event)."""
    deferred = _deferred.pop(session, None) == chosen
    payloads = _fetch_needed(session, chosen)
    tag = f"load{session.load_count}:memory"
    answers = session.gather(tag, (payloads is not None, deferred))
    oks = [ok for ok, _ in answers]
    skipped_hashing = answers[0][1]
    if skipped_hashing and not all(oks):
        # rank 0 skipped hashing the disk copy: verify it now, in full, as without memory
        again = None
        if session.ctx.rank == 0:
            _no_defer.add(session)
            try:
                again = choose_on_disk(session)
            finally:
                _no_defer.discard(session)
        again = session.gather(f"{tag}:disk", again)[0]
        skipped_hashing = False
        if again != chosen:
            return again, {}, {"tier": "disk", "memory": f"{chosen} did not verify on disk"}
    tiers = ["memory" if ok else "disk" for ok in oks]
    tier = tiers[0] if len(set(tiers)) == 1 else "mixed"
    fields: dict[str, Any] = {"tier": tier}
    if tier == "mixed":
        fields["tiers"] = tiers
    if skipped_hashing:
        fields["disk_hashing_skipped"] = True
    return chosen, payloads or {}, fields


def _fetch_needed(session: WorkerSession, chosen: str) -> dict[int, Any] | None:
    """The payloads :func:`~rayguard.train.protocol.read_state` will read, from memory
    and verified; None when any of them is not available there."""
    from pathlib import Path

    from rayguard import checkpoint as ck

    ctx = session.ctx
    try:
        manifest = ck.read_manifest(Path(chosen))
    except Exception:
        return None
    source = ctx.rank if manifest.world_size == ctx.world_size else ctx.previous_rank
    out: dict[int, Any] = {}
    if source is not None and manifest.shard_files_of(source):
        own = _fetch(session, chosen, manifest, source)
        if own is None:
            return None
        out[source] = own
        if own.get(_META, {}).get("has_state"):
            return out
    if manifest.shard_files_of(0) and 0 not in out:
        shared = _fetch(session, chosen, manifest, 0)
        if shared is None:
            return None
        out[0] = shared
    return out


def _fetch(session: WorkerSession, chosen: str, manifest: Any, rank: int) -> Any:
    import ray

    from rayguard.checkpoint.memory import load_snapshot, matches_manifest

    try:
        found = ray.get(session.coordinator.memory_lookup.remote(chosen, rank),
                        timeout=FETCH_TIMEOUT_S)
        if found is None:
            logger.info("rayguard: rank %d: no memory copy of rank %d's shard of %s; reading "
                        "the disk", session.ctx.rank, rank, chosen)
            return None
        refs, digests = found
        if not matches_manifest(digests, manifest, rank):
            raise ValueError("its digests are not the manifest's")
        files = ray.get(refs[0], timeout=FETCH_TIMEOUT_S)
        payload = load_snapshot(files, manifest, rank, chosen)
        return payload if isinstance(payload, dict) else None
    except Exception as exc:  # lost with its node, corrupt, timed out: the disk serves
        logger.warning("rayguard: rank %d: memory copy of rank %d's shard of %s unusable (%s: "
                       "%s); reading the disk", session.ctx.rank, rank, chosen,
                       type(exc).__name__, str(exc)[:300])
        return None
