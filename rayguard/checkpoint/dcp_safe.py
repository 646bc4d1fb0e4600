"""Reading the sharded (DCP) part of a checkpoint without running code from disk.

torch.distributed.checkpoint's own reader unpickles ``dcp/.metadata`` without restriction
and its default planner unpickles non-tensor values with ``torch.load(weights_only=False)``;
either runs whatever a crafted file asks (a pickle calling ``os.system``). A sha256 in the
manifest does not help: whoever can write the file can rewrite the manifest beside it.
This module is the one place rayguard reads DCP files:

* :func:`load_metadata` unpickles ``.metadata`` with an unpickler that admits only DCP's
  metadata classes (and the torch dtypes, sizes and layouts inside them) and refuses any
  other global with a CheckpointCorruptError naming the file and the class; it then checks
  that every storage entry points into a DCP data file the manifest lists, within its size;
* :func:`check_dcp` is what :func:`~rayguard.checkpoint.verify.verify` adds for a sharded
  checkpoint: the metadata check above, plus every non-tensor value loaded with
  ``torch.load(weights_only=True)``, so a checkpoint that needs code to load is reported
  invalid and the normal fallback takes the next older one;
* a ``.metadata`` whose bytes match the manifest but do not parse under this torch, when the
  manifest records another torch release, raises
  :class:`~rayguard.checkpoint.torch_compat.CheckpointVersionError` (another torch wrote it:
  not corrupt, never rejected) instead of the refusal above;
* :class:`SafeReader` and :class:`SafePlanner` are what ``load_state(sharded=...)`` hands to
  ``dcp.load``: the same metadata check on the bytes whose digest it compares with the
  manifest at the moment of reading, no rank-local ``__<rank>.metadata`` fallback (a file no
  manifest covers), and ``weights_only=True`` for non-tensor values.

Imports torch: import it lazily.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_fs
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from rayguard.checkpoint.dcp_layout import DCP_DIR, DCP_METADATA, owner_of
from rayguard.checkpoint.fsio import read_bounded
from rayguard.checkpoint.hashing import digest_bytes
from rayguard.checkpoint.manifest import FileRecord, Manifest, resolve_inside
from rayguard.checkpoint.torch_compat import (
    CheckpointVersionError,
    running_torch,
    version_mismatch,
)
from rayguard.exceptions import CheckpointCorruptError

MAX_METADATA_BYTES = 1 << 30
MAX_BYTES_VALUE = 64 * 1024 * 1024
"""A non-tensor DCP value larger than this is refused (they are scalars and small lists)."""

_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointCorruptError(
            f"{self._where}: refusing to unpickle {module}.{name}: a DCP metadata file holds "
            "only torch.distributed.checkpoint metadata classes, so this one was crafted to run "
            "code when loaded. Do not load this checkpoint; find out who wrote it.")


def _refuse(where: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{where}: {what}; refusing to load this DCP checkpoint")


def load_metadata(data: bytes, where: str, data_files: dict[str, int],
                  written_by: str | None = None) -> Any:
    """Unpickle DCP metadata (restricted) and check it; ``data_files``: the DCP data files the
    manifest lists, name -> size. Raises CheckpointCorruptError for anything else, or
    CheckpointVersionError when it does not parse and ``written_by`` (the torch version the
    manifest records) is another release than this torch's."""
    try:
        md = _MetadataUnpickler(data, where).load()
    except CheckpointCorruptError:
        raise
    except Exception as exc:  # UnpicklingError, EOFError, TypeError, ...: not metadata
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        other_torch = version_mismatch(written_by, running_torch(), error)
        if other_torch is not None:
            raise CheckpointVersionError(f"{where}: {other_torch}") from None
        raise _refuse(where, f"not a DCP metadata file ({error})") from None
    if type(md) is not dcp_md.Metadata:
        raise _refuse(where, f"holds a {type(md).__name__}, not DCP Metadata")
    if not isinstance(md.state_dict_metadata, dict) or not isinstance(md.storage_data, dict):
        raise _refuse(where, "its state_dict_metadata or storage_data is not a dict")
    kinds = (dcp_md.TensorStorageMetadata, dcp_md.BytesStorageMetadata)
    for fqn, value in md.state_dict_metadata.items():
        if not isinstance(fqn, str) or type(value) not in kinds:
            raise _refuse(where, f"entry {str(fqn)[:100]!r} is a {type(value).__name__}")
    for key, info in md.storage_data.items():
        _check_storage(key, info, where, data_files)
    return md


def _check_storage(key: Any, info: Any, where: str, data_files: dict[str, int]) -> None:
    if type(key) is not dcp_md.MetadataIndex or type(info) is not dcp_fs._StorageInfo:
        raise _refuse(where, f"storage entry {type(key).__name__} -> {type(info).__name__}")
    rel, offset, length = info.relative_path, info.offset, info.length
    if not isinstance(rel, str) or rel not in data_files:
        raise _refuse(where, f"{key.fqn!r} is stored in {str(rel)[:100]!r}, which is not a DCP "
                             "data file of this checkpoint's manifest")
    if (not all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, length))
            or offset < 0 or length < 0 or offset + length > data_files[rel]):
        raise _refuse(where, f"{key.fqn!r}: bytes [{offset}, +{length}) are not inside "
                             f"{rel} ({data_files[rel]} bytes)")
    if getattr(info, "transform_descriptors", None):
        raise _refuse(where, f"{key.fqn!r} uses storage transforms "
                             f"{info.transform_descriptors!r}, which rayguard never writes")


def _data_files(manifest: Manifest) -> dict[str, int]:
    prefix = f"{DCP_DIR}/"
    return {f.path.removeprefix(prefix): f.size_bytes for f in manifest.files
            if f.path.startswith(prefix) and f.path != f"{prefix}{DCP_METADATA}"}


def metadata_record(manifest: Manifest) -> FileRecord | None:
    return next((f for f in manifest.files if f.path == f"{DCP_DIR}/{DCP_METADATA}"), None)


def read_verified_metadata(checkpoint_dir: str | os.PathLike[str], manifest: Manifest) -> Any:
    """Read ``dcp/.metadata`` once, compare its digest with the manifest, then
    :func:`load_metadata` exactly those bytes. Raises CheckpointCorruptError, or
    CheckpointVersionError for metadata another torch wrote and this one cannot parse."""
    record = metadata_record(manifest)
    if record is None:
        raise CheckpointCorruptError(f"{checkpoint_dir}: its manifest lists no {DCP_DIR}/"
                                     f"{DCP_METADATA}; refusing to read unverified DCP metadata")
    path = resolve_inside(Path(checkpoint_dir), record.path)
    data = _read_bounded(path, min(record.size_bytes, MAX_METADATA_BYTES))
    if (len(data) != record.size_bytes
            or digest_bytes(data, scheme=record.scheme)[0] != record.digest):
        raise CheckpointCorruptError(f"{path}: does not match the manifest's size and digest "
                                     "(changed after the save)")
    return load_metadata(data, str(path), _data_files(manifest), manifest.torch_version)


def read_unlisted_metadata(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """The metadata of a DCP directory that no manifest covers (the caller's own, just
    written): the same restricted unpickling and storage checks, against the data files
    found there, with no digest to compare."""
    directory = os.path.join(checkpoint_dir, DCP_DIR)
    path = os.path.join(directory, DCP_METADATA)
    try:
        names = [n for n in os.listdir(directory) if owner_of(n) is not None and n != DCP_METADATA]
        files = {n: os.lstat(os.path.join(directory, n)).st_size for n in names}
    except OSError as exc:
        raise CheckpointCorruptError(f"{directory}: unreadable ({exc})") from None
    return load_metadata(_read_bounded(path, MAX_METADATA_BYTES), path, files)


def _read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    try:
        return read_bounded(path, limit, follow=False)
    except OSError as exc:
        raise CheckpointCorruptError(f"{path}: unreadable ({exc})") from None


def check_dcp(checkpoint_dir: str | os.PathLike[str], manifest: Manifest) -> list[tuple[str, str]]:
    """What :func:`~rayguard.checkpoint.verify.verify` adds for a sharded checkpoint whose
    files hashed correctly: (file, problem) for a metadata file that needs code to load or
    points outside the manifest, and for a non-tensor value ``weights_only`` refuses.
    Raises CheckpointVersionError when another torch wrote the metadata and this one cannot
    parse it (not a problem of the checkpoint: :func:`~rayguard.checkpoint.verify.verify`
    reports it as a note)."""
    where = f"{DCP_DIR}/{DCP_METADATA}"
    try:
        md = read_verified_metadata(checkpoint_dir, manifest)
    except CheckpointCorruptError as exc:
        return [(where, str(exc))]
    problems = []
    byte_values = {k for k, v in md.state_dict_metadata.items()
                   if type(v) is dcp_md.BytesStorageMetadata}
    for key, info in md.storage_data.items():
        if key.fqn in byte_values:
            problem = _check_bytes_value(checkpoint_dir, key.fqn, info)
            if problem:
                problems.append((f"{DCP_DIR}/{info.relative_path}", problem))
    return problems


def _check_bytes_value(checkpoint_dir: str | os.PathLike[str], fqn: str, info: Any) -> str | None:
    if info.length > MAX_BYTES_VALUE:
        return f"non-tensor value {fqn!r} is {info.length} bytes (over {MAX_BYTES_VALUE}); refused"
    try:
        path = resolve_inside(Path(checkpoint_dir), f"{DCP_DIR}/{info.relative_path}")
        with open(path, "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # weights_only's UnpicklingError, a short read, ...
        return (f"non-tensor value {fqn!r} cannot be loaded without running code from the file "
                f"(torch.load(weights_only=True) refused it: {type(exc).__name__}: "
                f"{str(exc)[:300]}); refusing to load this DCP checkpoint")
    return None


class SafeReader(FileSystemReader):
    """DCP's file reader, reading metadata only through :func:`read_verified_metadata` and
    never a rank-local ``__<rank>.metadata``."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], manifest: Manifest | None) -> None:
        super().__init__(os.path.join(checkpoint_dir, DCP_DIR))
        self._checkpoint_dir = checkpoint_dir
        self._manifest = manifest
        self.refusal: CheckpointCorruptError | None = None
        self.version_error: CheckpointVersionError | None = None
        """Set when another torch wrote the metadata and this one cannot parse it."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is not None:  # DCP's fallback after the global one failed
            raise self.refusal or self.version_error or CheckpointCorruptError(
                f"{self._checkpoint_dir}: refusing rank-local DCP metadata (no manifest covers it)")
        try:
            md = (read_unlisted_metadata(self._checkpoint_dir) if self._manifest is None
                  else read_verified_metadata(self._checkpoint_dir, self._manifest))
        except CheckpointCorruptError as exc:
            self.refusal = exc
            raise
        except CheckpointVersionError as exc:  # not corrupt: the load fails, nothing rejected
            self.version_error = exc
            raise
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = dcp_md.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor values loaded ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
