"""The checkpoint manifest: which files make up a checkpoint, their sizes and digests.

``rayguard_manifest.json`` is written last, atomically, inside the staging directory; a
directory without it is never a checkpoint. Every path in it is relative to the checkpoint
directory and must stay inside it (:func:`resolve_inside`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, TypeVar

from rayguard.checkpoint import auth, safejson
from rayguard.checkpoint.fsio import read_bounded
from rayguard.checkpoint.schemes import CHUNK_SIZE_BYTES, KNOWN, SHA256
from rayguard.exceptions import CheckpointCorruptError, CheckpointError

MANIFEST_NAME = "rayguard_manifest.json"
MANIFEST_FORMAT = "rayguard-checkpoint"
MANIFEST_VERSION = 1
_T = TypeVar("_T", bound=Hashable)


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint, as written by a rank."""

    path: str
    """Relative to the checkpoint directory, POSIX separators."""
    rank: int
    """The rank whose state the file holds."""
    size_bytes: int
    """Exact file size."""
    digest: str
    """Hex digest over the chunk digests, in ``scheme``."""
    chunk_digests: tuple[str, ...] = ()
    """Hex digest of each ``CHUNK_SIZE_BYTES`` chunk, in file order (locates corruption)."""
    scheme: str = SHA256
    """The digest scheme (:mod:`rayguard.checkpoint.schemes`). Not a per-file key in the JSON:
    the manifest's ``hash`` names it for all its files."""


@dataclass(frozen=True)
class ShardRecord:
    """What :func:`~rayguard.checkpoint.writer.write_shard` returns: picklable, small."""

    rank: int
    files: tuple[FileRecord, ...]


@dataclass(frozen=True)
class Manifest:
    world_size: int
    step: int | None
    files: tuple[FileRecord, ...]
    created_unix: float = field(default_factory=time.time)
    versions: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    key_id: str = ""
    """Read back: the id of the checkpoint key its keyed digest was checked with (``""``:
    not checked, no key set; :mod:`rayguard.checkpoint.auth`)."""

    @property
    def torch_version(self) -> str | None:
        """The torch release that wrote the checkpoint (:func:`release_of` of the recorded
        version), or None when the manifest records none."""
        recorded = self.versions.get("torch")
        if not isinstance(recorded, str) or recorded in ("", "not installed"):
            return None
        return release_of(recorded)

    @property
    def ranks(self) -> list[int]:
        return sorted({f.rank for f in self.files})

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def files_of(self, rank: int) -> tuple[FileRecord, ...]:
        return tuple(f for f in self.files if f.rank == rank)

    def shard_files_of(self, rank: int) -> tuple[FileRecord, ...]:
        """Rank ``rank``'s rayguard shard: its top-level files (the sharded part's DCP files
        live in ``dcp/``, see :mod:`rayguard.checkpoint.sharded`)."""
        return tuple(f for f in self.files_of(rank) if "/" not in f.path)

    @property
    def hash_scheme(self) -> str:
        """The one digest scheme of its files (sha256 for a manifest without files); raises
        CheckpointError when its files were hashed with different schemes."""
        schemes = {f.scheme for f in self.files}
        if len(schemes) > 1:
            raise CheckpointError(
                f"the ranks hashed this checkpoint's files with different schemes {sorted(schemes)}; "
                "one manifest names one. Fix: give every rank the same CheckpointConfig(hash=...)")
        return schemes.pop() if schemes else SHA256

    def to_json(self) -> str:
        doc = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "hash": self.hash_scheme,
            "chunk_size_bytes": CHUNK_SIZE_BYTES,
            "step": self.step,
            "world_size": self.world_size,
            "ranks": self.ranks,
            "created_unix": self.created_unix,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_unix)),
            "versions": self.versions,
            "metadata": self.metadata,
            "files": [_file_entry(f) for f in self.files],
        }
        key = auth.active()
        if key is not None:  # a checkpoint key is set: the manifest is signed with it
            doc[auth.AUTH_KEY] = auth.sign(doc, self.hash_scheme, key)
        return dumps_document(doc)


def _file_entry(f: FileRecord) -> dict[str, Any]:
    """The JSON object of one file (the keys of :class:`FileRecord` but ``scheme``); built
    by hand: ``dataclasses.asdict`` deep-copies (0.47 s over 65,536 files, against 0.015 s)."""
    return {"path": f.path, "rank": f.rank, "size_bytes": f.size_bytes, "digest": f.digest,
            "chunk_digests": list(f.chunk_digests)}


def dumps_document(doc: dict[str, Any]) -> str:
    """A manifest document as text: one top-level key per line and one file entry per line.

    Each value goes through the C encoder (``json.dumps(indent=...)`` runs the pure-Python
    one: with it, ``to_json`` of 65,536 files took 0.94 CPU seconds, 0.36 now). Any JSON reader reads it the same as
    ``json.dumps(doc, indent=1)``; the keyed digest covers the parsed document, not these
    bytes (:func:`rayguard.checkpoint.auth.canonical`)."""
    lines = []
    for name, value in doc.items():
        if name == "files" and isinstance(value, list) and value:
            text = "[\n  " + ",\n  ".join(json.dumps(e, allow_nan=False) for e in value) + "\n ]"
        else:
            text = json.dumps(value, allow_nan=False)
        lines.append(f" {json.dumps(name)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}"


def release_of(version: str) -> str:
    """``version`` without its local label: ``2.15.0+cu132`` -> ``2.15.0``. The manifest
    records each library's package metadata as is (``2.15.0`` from a default torch wheel,
    ``2.13.0+cpu`` from the CPU index; ``torch.__version__`` says ``2.15.0+cu132`` for the
    former); versions are compared in this form, which both share."""
    return version.strip().split("+", 1)[0]


def library_versions() -> dict[str, str]:
    """The versions a manifest records, as their package metadata says (compare them with
    :func:`release_of`)."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "ray", "rayguard", "numpy"):
        try:
            out[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


MAX_MANIFEST_BYTES = 256 * 1024 * 1024
"""A manifest larger than this is refused unread (a 10 TB checkpoint's is about 45 MB)."""
MAX_WORLD_SIZE = 1 << 20
MAX_FILE_BYTES = 1 << 62


def parse_manifest(text: str | bytes, where: str) -> Manifest:
    """Parse and validate a manifest; raises CheckpointCorruptError naming what is wrong (for
    any input: never another exception)."""
    doc = safejson.loads(text, f"{where}: manifest is invalid", max_bytes=MAX_MANIFEST_BYTES)
    key = auth.active()
    if key is not None:  # a checkpoint key is set: only a manifest signed with it is one
        auth.check(doc, where, key)
    try:
        if doc.get("format") != MANIFEST_FORMAT or doc.get("format_version") != MANIFEST_VERSION:
            raise ValueError(f"format {str(doc.get('format'))[:40]!r} version "
                             f"{str(doc.get('format_version'))[:40]!r} is not {MANIFEST_FORMAT!r} {MANIFEST_VERSION}")
        scheme = _scheme_of(doc)
        entries = doc["files"]
        if not isinstance(entries, list):
            raise ValueError(f"files is a {type(entries).__name__}, not a list")
        files = tuple(_file_record(f, scheme) for f in entries)
        step = doc["step"]
        manifest = Manifest(
            world_size=safejson.int_field(doc["world_size"], "world_size", 1, MAX_WORLD_SIZE),
            step=None if step is None else safejson.int_field(step, "step", -safejson.INT64_MAX),
            files=files,
            created_unix=safejson.float_field(doc["created_unix"], "created_unix"),
            versions=_dict_field(doc.get("versions", {}), "versions"),
            metadata=_dict_field(doc.get("metadata", {}), "metadata"),
            key_id="" if key is None else key.key_id,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(f"{where}: manifest is invalid ({str(exc)[:300]})") from None
    _check_consistency(manifest, doc.get("ranks"), where)
    return manifest


def _scheme_of(doc: dict[str, Any]) -> str:
    scheme = doc.get("hash")
    if scheme not in KNOWN:
        raise ValueError(
            f"it names hash scheme {str(scheme)[:40]!r}, which this rayguard cannot verify (it "
            f"knows {', '.join(KNOWN)}); written by a newer rayguard, or not by rayguard. Fix: "
            "upgrade rayguard to read it, or start from another checkpoint")
    if doc.get("chunk_size_bytes") != CHUNK_SIZE_BYTES:
        raise ValueError(f"chunk_size_bytes {str(doc.get('chunk_size_bytes'))[:40]!r} is not "
                         f"{CHUNK_SIZE_BYTES} (scheme {scheme!r})")
    return str(scheme)


def _dict_field(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} is a {type(value).__name__}, not an object")
    return dict(value)


def _file_record(f: Any, scheme: str) -> FileRecord:
    """One entry, checked (written out: it runs once per file of a 65,536-file manifest; the
    parser gives exact types, so ``type(x) is int`` is ``int_field``'s test where it passes)."""
    if type(f) is not dict:
        raise ValueError(f"a file entry is a {type(f).__name__}, not an object")
    path, digest, rank, size = f["path"], f["digest"], f["rank"], f["size_bytes"]
    if type(path) is not str or type(digest) is not str:
        raise ValueError(f"file entry {str(f)[:200]} has a non-string path or digest")
    chunks = f.get("chunk_digests", [])
    if type(chunks) is not list or any(type(d) is not str for d in chunks):
        raise ValueError(f"file {path[:200]!r}: chunk_digests is not a list of strings")
    if type(rank) is not int or not 0 <= rank <= MAX_WORLD_SIZE:
        rank = safejson.int_field(rank, "rank", 0, MAX_WORLD_SIZE)  # raises, naming it
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        size = safejson.int_field(size, "size_bytes", 0, MAX_FILE_BYTES)
    return FileRecord(path, rank, size, digest, tuple(chunks), scheme)


def _check_consistency(m: Manifest, ranks: Any, where: str) -> None:
    """O(files): the ranks sorted once, the paths counted in one set."""
    problems = []
    if m.world_size < 1:
        problems.append(f"world_size {m.world_size} < 1")
    actual = m.ranks
    if ranks != actual:
        problems.append(f"ranks {_head(ranks)} do not match the ranks of its files {_head(actual)}")
    outside = [r for r in actual if not 0 <= r < m.world_size]
    if outside:
        problems.append(f"ranks {_head(outside)} fall outside world_size {m.world_size}")
    twice = first_duplicate(f.path for f in m.files)
    if twice is not None:
        problems.append(f"a file is listed twice ({twice[:200]!r})")
    if any(f.size_bytes < 0 for f in m.files):
        problems.append("a negative size")
    if problems:
        raise CheckpointCorruptError(f"{where}: manifest is inconsistent: " + "; ".join(problems))


def _head(values: Any, limit: int = 8) -> str:
    """A list for a message: its first ``limit`` items and how many more (a 16,384-rank list
    is not a message)."""
    if not isinstance(values, list) or len(values) <= limit:
        return str(values)[:300]
    return f"{str(values[:limit])[:-1]}, ... ({len(values)} in all)]"


def first_duplicate(items: Iterable[_T]) -> _T | None:
    """The first item seen twice, or None (one pass, one set)."""
    seen: set[_T] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def is_plain_relative(rel: str) -> bool:
    """Whether ``rel`` is a plain relative POSIX path by string checks alone: non-empty, no
    leading ``/``, no ``\\``, ``:`` or NUL (so no Windows drive or root either), and no
    empty, ``.`` or ``..`` part. Every such path passes :func:`check_relative_path`; the
    others get its full check (``pathlib``: 0.45 s over 65,536 files, against 0.035 s)."""
    if not rel or "\\" in rel or ":" in rel or "\x00" in rel:
        return False
    framed = f"/{rel}/"  # every part between two slashes: an empty, "." or ".." part is found
    return "//" not in framed and "/./" not in framed and "/../" not in framed  # by search


def check_relative_path(rel: str) -> None:
    """Reject a manifest path that is absolute, has ``..``, or is not plain POSIX relative."""
    if not is_plain_relative(rel):
        check_relative_path_fully(rel)


def check_relative_path_fully(rel: str) -> None:
    """:func:`check_relative_path` through ``pathlib``'s POSIX and Windows parsers, for the
    paths :func:`is_plain_relative` does not clear."""
    posix, win = PurePosixPath(rel), PureWindowsPath(rel)
    bad = (
        not rel
        or posix.is_absolute()
        or win.is_absolute()
        or bool(win.drive)
        or "\\" in rel
        or "\x00" in rel
        or any(part in ("..", "") for part in rel.split("/"))
    )
    if bad:
        raise CheckpointCorruptError(
            f"manifest path {rel!r} points outside its checkpoint directory (absolute, '..' or "
            "malformed); refusing to read it. The manifest was tampered with or is corrupt."
        )


def resolve_inside(checkpoint_dir: Path, rel: str) -> Path:
    """The real path of manifest entry ``rel``; raises if it escapes ``checkpoint_dir``.

    Symlinks are followed, so a link inside the checkpoint that points outside is rejected.
    """
    check_relative_path(rel)
    root = Path(os.path.realpath(checkpoint_dir))
    target = Path(os.path.realpath(root / rel))
    if target != root and root not in target.parents:
        raise CheckpointCorruptError(
            f"manifest path {rel!r} resolves to {target}, outside the checkpoint directory "
            f"{root} (a symlink escapes it); refusing to read it."
        )
    return target


def read_manifest(checkpoint_dir: Path) -> Manifest:
    """Read and validate ``checkpoint_dir``'s manifest (raises CheckpointCorruptError)."""
    path = Path(checkpoint_dir) / MANIFEST_NAME
    try:
        text = read_bounded(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise CheckpointCorruptError(
            f"{checkpoint_dir}: no {MANIFEST_NAME}; the save never committed (crash or disk "
            "error during the save) or this is not a rayguard checkpoint"
        ) from None
    except OSError as exc:
        raise CheckpointCorruptError(f"{path}: unreadable manifest ({exc})") from None
    manifest = parse_manifest(text, str(path))
    for f in manifest.files:
        check_relative_path(f.path)
    return manifest
