"""Verify a checkpoint on disk: manifest, paths, sizes, and every chunk's digest (in the
scheme the manifest names)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rayguard.checkpoint.file_digests import hash_files
from rayguard.checkpoint.hashing import CHUNK_SIZE_BYTES
from rayguard.checkpoint.manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    is_plain_relative,
    read_manifest,
    resolve_inside,
)
from rayguard.checkpoint.schemes import short_name
from rayguard.checkpoint.torch_compat import CheckpointVersionError
from rayguard.exceptions import CheckpointCorruptError


class Problem(NamedTuple):
    """One thing wrong with a checkpoint: the file (relative path) and what is wrong."""

    file: str
    what: str


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`. Picklable."""

    path: str
    problems: tuple[Problem, ...]
    manifest: Manifest | None
    files_hashed: int = 0
    bytes_hashed: int = 0
    notes: tuple[Problem, ...] = ()
    """Not problems (``ok`` stays true): what this process cannot do with a checkpoint that
    verified, e.g. a DCP part another torch wrote and this torch cannot read
    (:mod:`rayguard.checkpoint.torch_compat`); loading it here fails, naming the fix."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.ok:
            return (f"{self.path}: ok ({self.files_hashed} files, {self.bytes_hashed} bytes "
                    "hashed)" + "".join(f"; note: {n.file}: {n.what}" for n in self.notes))
        return f"{self.path}: " + "; ".join(f"{p.file}: {p.what}" for p in self.problems)

    def to_dict(self) -> dict[str, object]:
        m = self.manifest
        return {
            "path": self.path,
            "ok": self.ok,
            "problems": [{"file": p.file, "what": p.what} for p in self.problems],
            "step": m.step if m else None,
            "world_size": m.world_size if m else None,
            "size_bytes": m.size_bytes if m else None,
            "files_hashed": self.files_hashed,
            "bytes_hashed": self.bytes_hashed,
            "notes": [{"file": n.file, "what": n.what} for n in self.notes],
        }


def describe_digest_mismatch(record: FileRecord, digest: str, chunks: tuple[str, ...]) -> str:
    """Name the first chunk (byte range) whose digest differs from the manifest's."""
    name = short_name(record.scheme)
    for i, (want, got) in enumerate(zip(record.chunk_digests, chunks, strict=False)):
        if want != got:
            lo, hi = i * CHUNK_SIZE_BYTES, min((i + 1) * CHUNK_SIZE_BYTES, record.size_bytes)
            return (
                f"{name} mismatch in bytes [{lo}, {hi}) (chunk {i + 1} of {len(chunks)}): "
                f"expected {want[:16]}..., got {got[:16]}... (contents changed after the save)"
            )
    return f"{name} mismatch: expected {record.digest[:16]}..., got {digest[:16]}..."


def verify(
    directory: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    hashes: bool = True,
    threads: int | None = None,
    only: Callable[[Manifest], Collection[str]] | None = None,
) -> VerifyReport:
    """Check a committed checkpoint; never raises for a bad checkpoint, reports instead.

    Checks that the manifest exists and parses, that every path stays inside ``directory``,
    that every file exists as a regular file of the recorded size, and (``hashes``) that its
    digest (the manifest's scheme) matches. ``ranks`` limits hashing to those ranks' files (sizes are still checked
    for all), so a rank can verify just what it will load; ``only`` (given the manifest,
    the paths to hash) does the same by path, so ranks can split a checkpoint's hashing.
    A DCP part another torch wrote, which this torch cannot parse, is a note, not a problem
    (:mod:`rayguard.checkpoint.torch_compat`).
    """
    root = Path(directory)
    try:
        manifest = read_manifest(root)
    except CheckpointCorruptError as exc:
        return VerifyReport(str(root), (Problem(MANIFEST_NAME, str(exc)),), None)
    problems: list[Problem] = []
    to_hash: list[tuple[FileRecord, str]] = []
    wanted = None if ranks is None else set(ranks)
    paths = None if only is None else set(only(manifest))
    real_root = os.path.realpath(root)  # once, not once per file
    folders: dict[str, bool] = {}  # each folder on the way checked once, not once per file
    for record in manifest.files:
        path = _check_file(root, real_root, record, problems, folders)
        if (path is not None and hashes and (wanted is None or record.rank in wanted)
                and (paths is None or record.path in paths)):
            to_hash.append((record, path))
    results = (hash_files([p for _, p in to_hash], threads=threads, scheme=manifest.hash_scheme,
                          sizes=[r.size_bytes for r, _ in to_hash])  # as just stat'ed
               if to_hash else [])
    verified = set()
    for (record, _), result in zip(to_hash, results, strict=True):
        if isinstance(result, BaseException):
            problems.append(Problem(record.path, f"unreadable ({result})"))
        elif result[0] != record.digest:
            problems.append(Problem(record.path, describe_digest_mismatch(record, *result)))
        else:
            verified.add(record.path)
    sharded_problems, notes = _check_sharded_part(root, manifest, verified)
    return VerifyReport(
        str(root),
        tuple(problems + sharded_problems),
        manifest,
        files_hashed=len(to_hash),
        bytes_hashed=sum(r.size_bytes for r, _ in to_hash),
        notes=notes,
    )


def _check_sharded_part(root: Path, manifest: Manifest,
                        verified: set[str]) -> tuple[list[Problem], tuple[Problem, ...]]:
    """For a checkpoint with a DCP part whose ``.metadata`` this call hashed: (problems,
    notes). Problems are what :func:`~rayguard.checkpoint.dcp_safe.check_dcp` finds (metadata
    or non-tensor values that would run code when loaded, storage entries outside the
    manifest's files); the note, a DCP part another torch wrote and this one cannot read
    (kept, never rejected: :mod:`rayguard.checkpoint.torch_compat`)."""
    from rayguard.checkpoint.dcp_layout import DCP_DIR, DCP_METADATA

    where = f"{DCP_DIR}/{DCP_METADATA}"
    if where not in verified:
        return [], ()
    from rayguard.checkpoint.dcp_safe import check_dcp  # imports torch

    try:
        return [Problem(file, what) for file, what in check_dcp(root, manifest)], ()
    except CheckpointVersionError as exc:
        return [], (Problem(where, str(exc)),)


def plain_file(real_root: str, rel: str,
               folders: dict[str, bool] | None = None) -> tuple[str, os.stat_result] | None:
    """``(path, stat)`` of manifest entry ``rel`` under ``real_root`` (a realpath) when no
    part of it is a symbolic link: ``lstat`` finds every directory on the way a directory
    and the file itself no link, so the path is already real and inside the checkpoint and
    its ``lstat`` is its ``stat``. None for anything else (a link, a missing part, an
    odd path): :func:`~rayguard.checkpoint.manifest.resolve_inside` then decides, as before.
    ``folders`` (kept by the caller across files): whether each folder on the way, by its
    path, was found a directory, so a folder shared by 49,152 files is ``lstat``-ed once.

    One ``lstat`` per part, where ``os.path.realpath`` takes one per part of the whole
    absolute path, twice per file (``verify(hashes=False)`` of 65,536 files: 4.4 CPU
    seconds with it, 0.9 now, most of it the manifest's parse)."""
    if not is_plain_relative(rel):
        return None
    folder, _, name = rel.rpartition("/")
    current = real_root.rstrip("/")  # "" for "/"
    try:
        if folder:
            current = f"{current}/{folder}"
            known = None if folders is None else folders.get(current)
            if known is None:
                known = _is_real_folder(real_root, folder)
                if folders is not None:
                    folders[current] = known
            if not known:
                return None
        current = f"{current}/{name}"
        st = os.lstat(current)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return None
    return current, st


def _is_real_folder(real_root: str, folder: str) -> bool:
    """Whether every part of ``folder`` under ``real_root`` is a directory, not a link."""
    current = real_root.rstrip("/")
    for part in folder.split("/"):
        current = f"{current}/{part}"
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            return False
    return True


def _check_file(root: Path, real_root: str, record: FileRecord, problems: list[Problem],
                folders: dict[str, bool] | None = None) -> str | None:
    found = plain_file(real_root, record.path, folders)
    if found is not None:
        path, st = found
    else:
        try:
            path = str(resolve_inside(root, record.path))
        except CheckpointCorruptError as exc:
            problems.append(Problem(record.path, str(exc)))
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            problems.append(Problem(record.path, "missing (deleted after the save?)"))
            return None
        except OSError as exc:
            problems.append(Problem(record.path, f"cannot stat ({exc})"))
            return None
    if not stat.S_ISREG(st.st_mode):
        problems.append(Problem(record.path, "not a regular file"))
        return None
    if st.st_size != record.size_bytes:
        problems.append(
            Problem(
                record.path,
                f"size is {st.st_size} bytes, the manifest says {record.size_bytes} "
                "(truncated or overwritten after the save)",
            )
        )
        return None
    return path
