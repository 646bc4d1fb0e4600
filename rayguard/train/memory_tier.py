"""The in-memory checkpoint tier, inside a worker (``CheckpointConfig(memory_tier=True)``).

Save: once a rank's shard is written, the rank packs the same bytes in memory
(:func:`~rayguard.checkpoint.memory.pack_shard`) and hands them to the *keeper* of its node, a
small actor created and owned by the run's coordinator
(:mod:`rayguard.run.keeper`), which ``ray.put``s them: the copy
lives in that node's object store, owned by a process that outlives the worker group (Ray
2.56 removed ``ray.put(_owner=)``, hence one keeper per node). A background thread then
registers the keeper's reference, with the shard's digests, with the coordinator, and asks it
to have the keeper of one peer node (:mod:`rayguard.checkpoint.peer`) take a second copy
(:mod:`rayguard.train.memory_peer`), so that one node's loss leaves a copy of every shard. Rank 0 tells the coordinator when the checkpoint
committed; only then are the copies servable, and the previous ones are freed.

Load: rank 0 still picks the checkpoint on disk. When the newest checkpoint on disk is the one
held in memory, rank 0 checks its manifest and file sizes but does not hash its files
(:func:`choose`); every rank then fetches the shard(s) it needs from memory and hashes them
against the manifest while decoding (:func:`prepare`): the copy on the node that saved it
first, else the peer's (a copy on a node that died is not tried). If no copy of a rank's
shard is there or verifies, rank 0 verifies the checkpoint on disk in full as before, and the ranks whose copy
failed read from disk.

Nothing here may fail a save or a load: any error of the memory tier means "read the disk".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rayguard import runtime
from rayguard.run.link import RunLink
from rayguard.train.memory_peer import queue_peer_copy, wait_idle

logger = logging.getLogger("rayguard")

_META = "__rayguard__"
# The keeper of each node once asked (a keeper outlives the worker group), the registrations
# in flight and their executor: this worker's, in its runtime (rayguard.runtime).


class MemoryTier:
    """One worker's half of the memory tier, over its link to the run (the protocol's
    :class:`~rayguard.train.protocol.MemoryTier`). ``enabled``: the config asks for it, the
    run has a coordinator and its storage is local or shared; else every call is a no-op."""

    def __init__(self, link: RunLink, *, enabled: bool, run_dir: str,
                 peer_copy: bool = True) -> None:
        self.link = link
        self._enabled = enabled and link.connected
        self._peer_copy = peer_copy
        """``CheckpointConfig(memory_peer_copy=)``: a peer node's keeper takes a copy too."""
        self._run_dir = run_dir
        self._deferred: str | None = None
        self._no_defer = False
        self._load_count = 0
        self._served: set[str] = set()

    @classmethod
    def for_run(cls, link: RunLink, config: Any, fs: Any) -> MemoryTier:
        """The tier ``CheckpointConfig(memory_tier=)`` asks for, on storage ``fs``."""
        from rayguard.checkpoint.remote import is_local

        return cls(link, enabled=bool(config.memory_tier) and is_local(fs),
                   run_dir=link.ctx.run_dir,
                   peer_copy=bool(getattr(config, "memory_peer_copy", True)))

    def enabled(self) -> bool:
        return self._enabled

    def loading(self, load_count: int) -> MemoryTier:
        """This tier for the ``load_count``-th ``load_state`` (its gathers' tags)."""
        self._load_count = load_count
        return self

    # -- save -----------------------------------------------------------------------------
    def offer(self, final: str, step: int, payload: Any, record: Any) -> None:
        """This rank's shard of ``final`` was written: keep a copy in memory (blocks only for
        one copy of the state into the object store; registration runs in the background)."""
        if not self._enabled or isinstance(record, BaseException):
            return
        import ray

        from rayguard.checkpoint.memory import digests_of, pack_shard

        rt = runtime.current()
        link, timeout_s = self.link, self.link.timeouts.memory_s
        try:
            _wait_pending()  # at most one offer in flight per worker
            keeper = self._keeper()
            files = pack_shard(link.ctx.rank, payload)
            held = keeper.hold.remote(files)  # the bytes are in the object store now
            del files
            digests = digests_of(record)
            peer_copy = self._peer_copy

            def register() -> None:
                link.memory_offer(final, step, digests, ray.get(held, timeout=timeout_s))
                if peer_copy:
                    queue_peer_copy(link, final)

            if rt.memory_executor is None:
                rt.memory_executor = runtime.pool(1, "rg-memory-tier")
            rt.memory_pending.append(rt.memory_executor.submit(register))
        except Exception as exc:
            logger.warning("rayguard: rank %d: no memory copy of %s (%s); a restart reads the "
                           "disk", link.ctx.rank, final, exc)

    def committed(self, final: str, step: int) -> None:
        """Rank 0: ``final`` committed; its memory copies become the servable ones."""
        if self._enabled:
            self.link.memory_commit(final, step)

    def _keeper(self) -> Any:
        node, keepers = self.link.ctx.node_id, runtime.current().memory_keepers
        if node not in keepers:
            keepers[node] = self.link.memory_keeper(node)
        return keepers[node]

    # -- load -----------------------------------------------------------------------------
    def choose(self, skip: set[str]) -> str | None:
        """Rank 0: the newest checkpoint on disk when it is the one held in memory and its
        manifest and file sizes check out (its hashing is left to the ranks' memory copies);
        else None."""
        if not self._enabled or self._no_defer:
            return None
        from rayguard import checkpoint as ck
        from rayguard.checkpoint.fallback import candidates_of, order_candidates

        try:
            held = self.link.memory_committed()
        except Exception as exc:
            logger.debug("rayguard: memory tier unavailable: %s", exc)
            return None
        if held is None:
            return None
        skipped = {os.path.realpath(p) for p in skip}
        newest = next((c for c in order_candidates(candidates_of(self._run_dir))
                       if os.path.realpath(c.path) not in skipped), None)
        if newest is None or str(newest.path) != held:
            return None
        if not ck.verify(held, hashes=False).ok:  # manifest parses, paths inside, sizes right
            return None
        self._deferred = held
        return held

    def prepare(self, chosen: str, choose_on_disk: Callable[[], str | None]
                ) -> tuple[str | None, dict[int, Any], dict[str, Any]]:
        """Every rank: fetch and verify the shard(s) this rank restores from memory; agree.

        Returns (checkpoint to restore, ``{saved rank: decoded payload}`` served from
        memory, fields for the ``restored`` event)."""
        deferred, self._deferred = self._deferred == chosen, None
        self._served = set()
        payloads = self._fetch_needed(chosen)
        served = ("peer" if "peer" in self._served else "own") if payloads is not None else None
        tag = f"load{self._load_count}:memory"
        answers = self.link.gather(tag, (payloads is not None, deferred, served))
        oks = [a[0] for a in answers]
        skipped_hashing = answers[0][1]
        if skipped_hashing and not all(oks):
            # rank 0 skipped hashing the disk copy: verify it now, in full, as without memory
            again = None
            if self.link.ctx.rank == 0:
                self._no_defer = True
                try:
                    again = choose_on_disk()
                finally:
                    self._no_defer = False
            again = self.link.gather(f"{tag}:disk", again)[0]
            skipped_hashing = False
            if again != chosen:
                return again, {}, {"tier": "disk", "memory": f"{chosen} did not verify on disk"}
        return chosen, payloads or {}, _tier_fields(oks, skipped_hashing,
                                                    [a[2] for a in answers])

    def _fetch_needed(self, chosen: str) -> dict[int, Any] | None:
        """The payloads :func:`~rayguard.train.protocol.read_state` will read, from memory
        and verified; None when any of them is not available there."""
        from pathlib import Path

        from rayguard import checkpoint as ck

        ctx = self.link.ctx
        try:
            manifest = ck.read_manifest(Path(chosen))
        except Exception:
            return None
        source = ctx.rank if manifest.world_size == ctx.world_size else ctx.previous_rank
        out: dict[int, Any] = {}
        if source is not None and manifest.shard_files_of(source):
            own = self._fetch(chosen, manifest, source)
            if own is None:
                return None
            out[source] = own
            if own.get(_META, {}).get("has_state"):
                return out
        if manifest.shard_files_of(0) and 0 not in out:
            shared = self._fetch(chosen, manifest, 0)
            if shared is None:
                return None
            out[0] = shared
        return out

    def _fetch(self, chosen: str, manifest: Any, rank: int) -> Any:
        """Rank ``rank``'s payload of ``chosen`` from a memory copy that verifies (own copy
        first, then the peer's; records which in ``self._served``), else None."""
        from rayguard.checkpoint.memory import matches_manifest

        me = self.link.ctx.rank
        try:
            found = self.link.memory_lookup(chosen, rank)
            if found is None or not found[0]:
                logger.info("rayguard: rank %d: no memory copy of rank %d's shard of %s; "
                            "reading the disk", me, rank, chosen)
                return None
            copies, digests = found
            if not matches_manifest(digests, manifest, rank):
                raise ValueError("its digests are not the manifest's")
        except Exception as exc:
            logger.warning("rayguard: rank %d: memory tier unavailable for rank %d's shard of "
                           "%s (%s); reading the disk", me, rank, chosen, exc)
            return None
        for which, node, refs in copies:
            payload = self._fetch_copy(chosen, manifest, rank, which, node, refs)
            if payload is not None:
                self._served.add(which)
                return payload
        return None

    def _fetch_copy(self, chosen: str, manifest: Any, rank: int, which: str, node: str,
                    refs: list[Any]) -> Any:
        import ray

        from rayguard.checkpoint.memory import load_snapshot

        try:
            files = ray.get(refs[0], timeout=self.link.timeouts.memory_s)
            payload = load_snapshot(files, manifest, rank, chosen)
            return payload if isinstance(payload, dict) else None
        except Exception as exc:  # lost with its node, corrupt, timed out: the next copy
            logger.warning("rayguard: rank %d: %s memory copy (node %s) of rank %d's shard of "
                           "%s unusable (%s: %s)", self.link.ctx.rank, which, node[:12], rank,
                           chosen, type(exc).__name__, str(exc)[:300])
            return None


def _tier_fields(oks: list[bool], skipped_hashing: bool,
                 served: list[str | None] | None = None) -> dict[str, Any]:
    """The ``restored`` event's fields: which tier each rank read and, of those that read
    memory, which copy served them (``copy``: "own", "peer", or "mixed" with ``copies``)."""
    tiers = ["memory" if ok else "disk" for ok in oks]
    tier = tiers[0] if len(set(tiers)) == 1 else "mixed"
    fields: dict[str, Any] = {"tier": tier}
    if tier == "mixed":
        fields["tiers"] = tiers
    if skipped_hashing:
        fields["disk_hashing_skipped"] = True
    copies = [c if ok else None for ok, c in zip(oks, served or [None] * len(oks), strict=True)]
    used = {c for c in copies if c is not None}
    if used:
        fields["copy"] = used.pop() if len(used) == 1 else "mixed"
        if fields["copy"] == "mixed" or tier == "mixed":
            fields["copies"] = copies
    return fields


def _wait_pending() -> None:
    pending: list[Future[None]] = runtime.current().memory_pending
    while pending:
        future = pending.pop(0)
        try:
            future.result(timeout=120.0)
        except Exception as exc:
            logger.warning("rayguard: a memory copy was not registered (%s); a restart after "
                           "it reads the disk", exc)


def flush() -> None:
    """Wait for the background registration and peer copy (tests, benchmarks, end of a
    worker)."""
    _wait_pending()
    wait_idle()
