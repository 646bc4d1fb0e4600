"""Sealing the checkpoints ranks give ``ray.train.report``, never waiting across Ray's barrier.

Ray's report meets every rank first (``broadcast_from_rank_zero``: the checkpoint's directory
name), then uploads: ``SYNC`` in the calling thread, ``ASYNC`` in its upload thread,
``NO_UPLOAD`` not at all. Ranks may mix modes at one report, and report a checkpoint or
none. A rank that waits for a peer's record before that barrier, while the peer makes its
record only after it, waits forever, the peer waiting for it in the barrier. So the seal
meets the ranks twice at the run's coordinator, and every rank's part of each meeting is
made without waiting on any barrier:

1. **claims**, in the loop, before Ray's report: each rank says whether it reports a local
   directory, and its upload mode. Only ranks with a directory wait for the others' claims
   (each made before its rank enters the barrier); from them each knows the writer (the
   lowest rank with a directory) and where hashing runs (:func:`plan_seal`);
2. **records**: each rank with a directory hashes it and contributes its record, the others
   ``None``; only the writer waits for the records, and writes the manifest. When every rank
   with a directory uploads ``ASYNC``, this runs in Ray's upload threads, after the barrier
   and off the loop (all the records are made there or before it). Otherwise every rank
   hashes in the loop before Ray's report: an ``ASYNC`` rank beside a ``SYNC`` or
   ``NO_UPLOAD`` one pays its hashing in the loop, as a ``SYNC`` rank always does.

The manifest itself is :mod:`rayguard.checkpoint.reported`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayguard._ray.report import CheckpointUploadMode, default_upload
from rayguard.run.link import RunLink

if TYPE_CHECKING:
    from rayguard.checkpoint.manifest import Manifest

RECORDS = ":records"
"""Suffix of a report's tag for the second meeting (the records)."""

UNIT_FIELD = "step_unit"
"""The manifest's metadata field with what the sealed ``step`` counts (the report's step
key, or ``"report"``), and the events' field of the same name."""

Claim = tuple[int, str]
"""``(rank, upload mode's value)`` of a rank reporting a local directory."""


@dataclass(frozen=True)
class SealPlan:
    """Where one report's checkpoint is sealed, as every rank's claim decides it."""

    writer: int | None
    """The rank that writes the manifest: the lowest reporting a local directory (``None``:
    none does)."""
    deferred: bool
    """Every rank with a directory uploads ``ASYNC``: hashing and the records' meeting run in
    Ray's upload threads, off the loop."""


def plan_seal(claims: Sequence[Claim | None]) -> SealPlan:
    """The plan every rank with a directory reads from the same claims."""
    present = [c for c in claims if c is not None]
    if not present:
        return SealPlan(writer=None, deferred=False)
    return SealPlan(writer=min(rank for rank, _ in present),
                    deferred=all(mode == CheckpointUploadMode.ASYNC.value for _, mode in present))


@dataclass(frozen=True)
class Prepared:
    """What :meth:`ReportSealer.prepare` leaves for Ray's report."""

    upload: Any
    """The ``checkpoint_upload_fn`` to give Ray (the loop's own where nothing is added)."""
    persisted_at_report: bool
    """This rank wrote the manifest of a ``NO_UPLOAD`` checkpoint: it is in the run's storage
    once Ray's report returns."""
    sealed_bytes: int | None = None
    """With :attr:`persisted_at_report`: the bytes the manifest seals."""


Persisted = Callable[[int, "str | None", "int | None"], None]
"""``persisted(step, path, sealed_bytes)``: called on the writer rank once a sealed
checkpoint is in the run's storage; ``sealed_bytes``: the sizes its manifest lists, summed."""


class ReportSealer:
    """Seals one worker's ``ray.train.report`` checkpoints through ``link`` (the loop's link:
    its waits are progress); ``persisted`` (:data:`Persisted`) is called on the writer rank
    once the sealed checkpoint is in the run's storage."""

    def __init__(self, link: RunLink, persisted: Persisted) -> None:
        self.link = link
        self.persisted = persisted

    def prepare(self, tag: str, directory: str | None, mode: Any, step: int,
                user_upload: Any, *, unit: str | None = None) -> Prepared:
        """This rank's part of the seal before Ray's report (in the loop); ``unit``: what
        ``step`` counts, recorded in the manifest beside it."""
        link = self.link
        if directory is None:  # nothing to seal here; never waits
            link.contribute(tag, None)
            link.contribute(tag + RECORDS, None)
            return Prepared(user_upload, False)
        rank, mode = link.ctx.rank, CheckpointUploadMode(mode)
        plan = plan_seal(link.gather(tag, (rank, mode.value)))
        # replica groups (link.alone) each hold the whole state: rank 0's is sealed
        writer = plan.writer == rank and (rank == 0 or not link.alone)
        if plan.deferred:
            return Prepared(self._upload(step, user_upload, writer, seal=lambda: self._seal(
                tag, directory, step, writer, link.quiet(), unit)), False)
        manifest = self._seal(tag, directory, step, writer, link, unit)
        sealed = None if manifest is None else manifest.size_bytes
        if mode == CheckpointUploadMode.NO_UPLOAD:
            return Prepared(user_upload, writer, sealed)
        return Prepared(self._upload(step, user_upload, writer, sealed=sealed) if writer
                        else user_upload, False)

    def _upload(self, step: int, user_upload: Any, writer: bool,
                seal: Callable[[], Manifest | None] | None = None,
                sealed: int | None = None) -> Any:
        def upload(checkpoint: Any, checkpoint_dir_name: str) -> Any:
            sealed_bytes = sealed
            if seal is not None:
                manifest = seal()
                sealed_bytes = None if manifest is None else manifest.size_bytes
            upload_fn = default_upload if user_upload is None else user_upload
            persisted = upload_fn(checkpoint, checkpoint_dir_name)
            if writer:
                self.persisted(step, getattr(persisted, "path", None), sealed_bytes)
            return persisted

        return upload

    def _seal(self, tag: str, directory: str, step: int, writer: bool, link: RunLink,
              unit: str | None = None) -> Manifest | None:
        """Hash this rank's directory; the writer waits for every rank's record and writes
        the manifest (returned), the others contribute theirs and go on (``None``)."""
        from rayguard.checkpoint import reported

        ctx = link.ctx
        if not writer:  # before its record goes: the writer's manifest is written after
            reported.drop_stale_manifest(directory)
        record = reported.hash_directory(directory, ctx.rank)
        if not writer:
            link.contribute(tag + RECORDS, record)
            return None
        records = link.gather(tag + RECORDS, record)
        return reported.seal(directory, records, world_size=ctx.world_size, step=step,
                             metadata=seal_metadata(ctx.attempt, records, unit))


def seal_metadata(attempt: int, records: Sequence[Any], unit: str | None) -> dict[str, Any]:
    """What a reported checkpoint's manifest records beside its step: the attempt, the ranks
    that reported a directory and, when known, what the step counts (:data:`UNIT_FIELD`)."""
    meta: dict[str, Any] = {"attempt": attempt,
                            "reported_by": [r.rank for r in records if r is not None]}
    if unit is not None:
        meta[UNIT_FIELD] = unit
    return meta
