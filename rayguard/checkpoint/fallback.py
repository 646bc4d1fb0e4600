"""Find the newest checkpoint that verifies, skipping (and reporting) every bad one.

:func:`order_candidates` is the pure planner (newest first); :func:`scan` applies it to a
directory and verifies candidates one by one until one passes.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayguard.checkpoint import safejson
from rayguard.checkpoint.commit import STAGING_PREFIX
from rayguard.checkpoint.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from rayguard.checkpoint.reported import REPORTED_SOURCE
from rayguard.checkpoint.verify import Problem, VerifyReport, verify
from rayguard.exceptions import CheckpointError

logger = logging.getLogger("rayguard.checkpoint")

CHECKPOINT_NAME_PREFIX = "checkpoint"  # directories without a manifest count only with this prefix


@dataclass(frozen=True)
class Candidate:
    """A directory that may be a checkpoint."""

    path: Path
    step: int | None
    """The manifest's step; None when it has none or the manifest cannot be read."""
    mtime: float
    manifest_readable: bool = True
    source: str | None = None
    """The manifest's ``metadata["source"]``: ``"ray.train.report"`` for a directory a loop
    reported (:mod:`rayguard.checkpoint.reported`), ``None`` for rayguard's own."""


@dataclass(frozen=True)
class Rejection:
    """A checkpoint that failed verification, with why. Record it to never try it again."""

    path: str
    problems: tuple[Problem, ...]

    def describe(self) -> str:
        return f"{self.path}: " + "; ".join(f"{p.file}: {p.what}" for p in self.problems)


@dataclass(frozen=True)
class ScanResult:
    chosen: Path | None
    """The newest checkpoint that verified, or None."""
    report: VerifyReport | None
    """Its verification report."""
    rejected: tuple[Rejection, ...]
    """Newer checkpoints that failed, newest first."""


def order_candidates(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Newest first: by manifest step, then mtime.

    A directory whose manifest cannot be read sorts first (it may be the newest save; it is
    rejected and reported rather than silently ignored); a manifest without a step sorts
    after every stepped one, by mtime.
    """

    def key(c: Candidate) -> tuple[float, float]:
        if not c.manifest_readable:
            return (math.inf, c.mtime)
        return (-1.0 if c.step is None else float(c.step), c.mtime)

    return sorted(candidates, key=key, reverse=True)


def list_candidates(root: str | os.PathLike[str]) -> list[Candidate]:
    """Every child directory of ``root`` with a manifest or a ``checkpoint*`` name."""
    out = []
    try:
        children = sorted(Path(root).iterdir())
    except FileNotFoundError:
        return []
    for child in children:
        if child.name.startswith((".", STAGING_PREFIX)) or not child.is_dir():
            continue
        manifest = child / MANIFEST_NAME
        if not manifest.exists() and not child.name.startswith(CHECKPOINT_NAME_PREFIX):
            continue
        step, readable, source = _peek(manifest)
        try:
            mtime = (manifest if manifest.exists() else child).stat().st_mtime
        except OSError:
            mtime = 0.0
        out.append(Candidate(child, step, mtime, readable, source))
    return out


def candidates_of(root: str | os.PathLike[str], *, reported: bool = False) -> list[Candidate]:
    """:func:`list_candidates` of one kind: rayguard's own checkpoints, or (``reported``) the
    directories a loop gave to ``ray.train.report``."""
    return [c for c in list_candidates(root) if _wanted(c, reported)]


def _peek(manifest: Path) -> tuple[int | None, bool, str | None]:
    """``(step, readable, source)`` of a manifest, read without verifying anything."""
    try:
        doc = safejson.read_file(manifest, str(manifest), max_bytes=MAX_MANIFEST_BYTES)
        step = doc.get("step")
        metadata = doc.get("metadata")
        source = metadata.get("source") if isinstance(metadata, dict) else None
        return ((None if step is None else safejson.int_field(step, "step", -safejson.INT64_MAX)),
                True, source if isinstance(source, str) else None)
    except (OSError, ValueError, CheckpointError):
        return None, False, None


def _wanted(cand: Candidate, reported: bool) -> bool:
    """rayguard's own checkpoints (``reported=False``; a directory whose manifest cannot be
    read is tried, and rejected, by both kinds of reader) or the ones a loop reported."""
    if not cand.manifest_readable:
        return True
    return (cand.source == REPORTED_SOURCE) == reported


def scan(
    root: str | os.PathLike[str],
    *,
    skip: Iterable[str | os.PathLike[str]] = (),
    ranks: Iterable[int] | None = None,
    threads: int | None = None,
    reported: bool = False,
) -> ScanResult:
    """Verify checkpoints under ``root`` newest first; stop at the first that passes.

    ``skip`` are checkpoints rejected before (never tried again). Each rejection is logged as
    a warning naming the checkpoint, the file and the problem, and returned in ``rejected``.
    ``ranks`` limits hashing to those ranks' files (see :func:`verify`). ``reported``: scan
    the directories a loop gave to ``ray.train.report`` instead of rayguard's own.
    """
    skipped = {os.path.realpath(p) for p in skip}
    rank_list: Sequence[int] | None = None if ranks is None else list(ranks)
    rejected: list[Rejection] = []
    for cand in order_candidates(candidates_of(root, reported=reported)):
        if os.path.realpath(cand.path) in skipped:
            continue
        report = verify(cand.path, ranks=rank_list, threads=threads)
        if report.ok:
            return ScanResult(cand.path, report, tuple(rejected))
        rejection = Rejection(str(cand.path), report.problems)
        logger.warning("rayguard: skipping checkpoint %s; trying an older one", rejection.describe())
        rejected.append(rejection)
    if rejected:
        logger.warning("rayguard: no valid checkpoint under %s (%d rejected)", root, len(rejected))
    return ScanResult(None, None, tuple(rejected))


def find_latest_valid(
    root: str | os.PathLike[str],
    *,
    skip: Iterable[str | os.PathLike[str]] = (),
    ranks: Iterable[int] | None = None,
) -> tuple[Path, VerifyReport] | None:
    """(path, report) of the newest checkpoint under ``root`` that verifies, or None."""
    result = scan(root, skip=skip, ranks=ranks)
    if result.chosen is None or result.report is None:
        return None
    return result.chosen, result.report


@dataclass(frozen=True)
class LoadResult:
    path: Path | None
    """The checkpoint the state came from; None when no checkpoint verified."""
    state: Any
    rejected: tuple[Rejection, ...]
    """Newer checkpoints that failed, newest first (record them; pass as ``skip`` later)."""


def load_latest_valid(
    root: str | os.PathLike[str],
    rank: int,
    *,
    skip: Iterable[str | os.PathLike[str]] = (),
    map_location: str | None = None,
) -> LoadResult:
    """Rank ``rank``'s state from the newest checkpoint under ``root`` that verifies.

    One read pass per candidate: every file's presence and size is checked (so a checkpoint
    missing any rank's file is rejected by every rank alike), then the rank's own shard (or
    rank 0's, for replicated state) is hashed while it is loaded. Bad candidates are logged,
    returned in ``rejected``, and the next older one is tried.
    """
    skipped = {os.path.realpath(p) for p in skip}
    rejected: list[Rejection] = []
    for cand in order_candidates(candidates_of(root)):
        if os.path.realpath(cand.path) in skipped:
            continue
        report = verify(cand.path, hashes=False)
        problems = report.problems
        if not problems:
            try:
                from rayguard.checkpoint.reader import read_shard  # imports torch

                state = read_shard(cand.path, rank, map_location=map_location)
                return LoadResult(cand.path, state, tuple(rejected))
            except CheckpointError as exc:
                problems = (Problem(_file_of(exc, cand.path), str(exc)),)
        rejection = Rejection(str(cand.path), problems)
        logger.warning("rayguard: skipping checkpoint %s; trying an older one", rejection.describe())
        rejected.append(rejection)
    return LoadResult(None, None, tuple(rejected))


def _file_of(exc: Exception, checkpoint: Path) -> str:
    """The shard file an error message starts with, relative to the checkpoint if possible."""
    head = str(exc).split(":", 1)[0]
    try:
        return str(Path(head).relative_to(checkpoint))
    except ValueError:
        return head
