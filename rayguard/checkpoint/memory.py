"""The in-memory tier's pure part: a rank's shard as bytes, and which snapshot may be served.

:func:`pack_shard` builds, in memory, exactly the bytes :func:`~rayguard.checkpoint.writer.
write_shard` writes for the same payload, as ``{relative file path: uint8 array}``.
:func:`load_snapshot` decodes such a mapping with the disk path's decoder, after checking every
file against the committed manifest (set of files, sizes, sha256): a snapshot that does not
match the manifest byte for byte is never decoded into a state.

:class:`SnapshotRegistry` is the bookkeeping the run's coordinator keeps: one snapshot per
rank per checkpoint, servable only once its checkpoint committed, and at most two per rank at
any time (the newest committed one and the one being saved). A snapshot has up to two copies:
the one on the node that saved it (*own*) and one on a peer node (*peer*,
:mod:`rayguard.checkpoint.peer`); :meth:`SnapshotRegistry.copies` lists the live ones, own
first. No Ray, no processes: the references it holds are opaque to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayguard.checkpoint.manifest import Manifest, ShardRecord
from rayguard.exceptions import CheckpointCorruptError


def pack_shard(rank: int, payload: Any) -> dict[str, np.ndarray]:
    """Rank ``rank``'s shard of ``payload`` as ``{file name: bytes}`` (one copy of the state)."""
    from rayguard.checkpoint import format as fmt  # imports torch: not in the coordinator
    from rayguard.checkpoint.writer import shard_file_name

    structure, entries = fmt.encode(payload)
    header = fmt.build_header(structure, entries)
    out = np.empty(len(header) + sum(e.nbytes for e in entries), dtype=np.uint8)
    out[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    offset = len(header)
    for entry in entries:
        view, _owner = fmt.source_buffer(entry)
        if entry.nbytes:
            out[offset : offset + entry.nbytes] = np.frombuffer(view, dtype=np.uint8)
        offset += entry.nbytes
    return {shard_file_name(rank): out}


def digests_of(record: ShardRecord) -> dict[str, str]:
    """``{file path: digest}`` of a written shard (what the coordinator keeps beside the copy)."""
    return {f.path: f.digest for f in record.files}


def matches_manifest(digests: Mapping[str, str], manifest: Manifest, rank: int) -> bool:
    """Whether a snapshot's recorded digests are those the manifest lists for ``rank``'s shard
    (cheap: decides whether fetching the bytes is worth it; the bytes are hashed anyway)."""
    return dict(digests) == {f.path: f.digest for f in manifest.shard_files_of(rank)}


def load_snapshot(files: Mapping[str, Any], manifest: Manifest, rank: int, where: str) -> Any:
    """Decode rank ``rank``'s shard from ``files`` after checking it against ``manifest``.

    Raises CheckpointCorruptError when the files are not exactly the manifest's (a file
    missing or extra, a size or a digest that differs)."""
    records = manifest.shard_files_of(rank)
    if not isinstance(files, Mapping) or not all(isinstance(k, str) for k in files):
        raise CheckpointCorruptError(f"{where}: memory copy of rank {rank} is a "
                                     f"{type(files).__name__}, not a mapping of file names")
    if sorted(files) != sorted(r.path for r in records) or len(records) != 1:
        raise CheckpointCorruptError(
            f"{where}: memory copy of rank {rank} holds {sorted(files)}, the manifest lists "
            f"{sorted(r.path for r in records)}")
    from rayguard.checkpoint.reader import read_shard_bytes

    record = records[0]
    return read_shard_bytes(files[record.path], record, f"{where} (memory copy of {record.path})")


@dataclass
class Snapshot:
    """One rank's memory copy of one checkpoint."""

    path: str
    """The checkpoint's final directory."""
    step: int
    rank: int
    node: str
    """The node whose object store holds it."""
    digests: dict[str, str]
    refs: Any = field(default=None, repr=False)
    """Opaque to the registry (the adapter's object references)."""
    peer: str | None = None
    """The node whose object store holds the second copy (None: none yet, or no peer)."""
    peer_refs: Any = field(default=None, repr=False)
    """The second copy's references (opaque, as ``refs``)."""


class SnapshotRegistry:
    """Which memory copies exist and which one may be served, per rank.

    Offers and the commit may arrive in any order (they come from different processes): an
    offer for the committed checkpoint that arrives late is still accepted, an offer for a
    checkpoint older than the committed one is refused."""

    def __init__(self) -> None:
        self.committed: str | None = None
        self.committed_step: int | None = None
        self._by_rank: dict[int, dict[str, Snapshot]] = {}

    def offer(self, snap: Snapshot) -> list[Snapshot]:
        """Keep ``snap``; returns the snapshots dropped (stale ones, or ``snap`` itself)."""
        if (snap.path != self.committed and self.committed_step is not None
                and snap.step <= self.committed_step):
            return [snap]
        held = self._by_rank.setdefault(snap.rank, {})
        dropped = [s for p, s in held.items() if p not in (snap.path, self.committed)]
        dropped += [held[snap.path]] if snap.path in held else []
        for s in dropped:
            held.pop(s.path, None)
        held[snap.path] = snap
        return dropped

    def commit(self, path: str, step: int) -> list[Snapshot]:
        """``path`` committed: its snapshots become servable, every older one is dropped."""
        self.committed, self.committed_step = path, step
        dropped = []
        for held in self._by_rank.values():
            for p, s in list(held.items()):
                if p != path and s.step <= step:
                    dropped.append(held.pop(p))
        return dropped

    def lookup(self, path: str, rank: int) -> Snapshot | None:
        """Rank ``rank``'s snapshot of ``path`` if ``path`` is the committed checkpoint."""
        if path != self.committed:
            return None
        return self._by_rank.get(rank, {}).get(path)

    def snapshot(self, path: str, rank: int) -> Snapshot | None:
        """Rank ``rank``'s snapshot of ``path`` if held (committed or not)."""
        return self._by_rank.get(rank, {}).get(path)

    def offer_peer(self, path: str, rank: int, node: str, refs: Any) -> bool:
        """Rank ``rank``'s snapshot of ``path`` has a second copy on ``node``; False (the
        copy is not kept) when that snapshot is no longer held or ``node`` is its own."""
        snap = self.snapshot(path, rank)
        if snap is None or node == snap.node:
            return False
        snap.peer, snap.peer_refs = node, refs
        return True

    def copies(self, path: str, rank: int, alive: Collection[str] | None = None
               ) -> list[tuple[str, str, Any]]:
        """The servable copies of rank ``rank``'s snapshot of ``path`` as ``(which, node,
        refs)``, ``which`` being ``"own"`` or ``"peer"``: the own copy first, a copy on a
        node not in ``alive`` (``None``: every node is) left out; ``[]`` when ``path`` is not
        the committed checkpoint."""
        snap = self.lookup(path, rank)
        if snap is None:
            return []
        found = [("own", snap.node, snap.refs)]
        if snap.peer is not None:
            found.append(("peer", snap.peer, snap.peer_refs))
        return [c for c in found if alive is None or c[1] in alive]

    def nodes_of(self, path: str) -> dict[int, str]:
        """``{rank: node that saved it}`` of the snapshots of ``path`` held."""
        return {rank: held[path].node for rank, held in self._by_rank.items() if path in held}

    def held(self) -> list[Snapshot]:
        return [s for held in self._by_rank.values() for s in held.values()]
