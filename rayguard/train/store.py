"""Where a run's checkpoints live: a :class:`CheckpointStore`, chosen once per worker.

The commit protocol (:mod:`rayguard.train.protocol`) is the same on every filesystem; what
differs is how a rank stages its files, how the manifest is published and how a reader gets
a local copy. :class:`LocalStore` (a local or shared path: stage beside the final directory,
publish with one ``rename(2)``) and :class:`RemoteStore` (a pyarrow filesystem such as S3:
stage in a local temporary directory, upload, write the manifest last in one object) hold
those differences; :func:`store_for` picks one from the run's filesystem. No Ray import.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from rayguard.checkpoint.manifest import MANIFEST_NAME, ShardRecord
from rayguard.checkpoint.verify import Problem
from rayguard.exceptions import CheckpointCorruptError, CheckpointError


@runtime_checkable
class CheckpointStore(Protocol):
    """What the checkpoint protocol needs from the run's storage."""

    root: str
    """The run directory (a local path, or a path on the remote filesystem)."""
    fs: Any
    """The remote pyarrow filesystem, or ``None`` for a local/shared path."""

    def final_path(self, name: str) -> str:
        """Where the checkpoint ``name`` is published."""
        ...

    def taken(self, final: str) -> bool:
        """Whether an earlier save published at ``final`` (an earlier ``fit()`` of the same
        run reached the same step in an attempt of the same number). Never true of what the
        save asking is writing: it shows only once every rank has written."""
        ...

    def stage(self, final: str) -> Any:
        """A context manager giving a local directory this rank writes its files into."""
        ...

    def upload(self, staged: str, final: str, record: ShardRecord) -> None:
        """Make the files of ``record`` written in ``staged`` part of ``final``'s staging."""
        ...

    def staged_names(self, final: str, subdir: str) -> list[str]:
        """File names under ``subdir`` of the not yet committed ``final`` (every rank's)."""
        ...

    def commit(self, final: str, records: list[ShardRecord], *, world_size: int, step: int,
               metadata: dict[str, Any]) -> str:
        """Write the manifest last and publish ``final`` atomically; returns its path."""
        ...

    def discard(self, final: str) -> None:
        """Remove what a failed save left (never a committed checkpoint)."""
        ...

    def cleanup(self) -> None:
        """Remove staging left by saves that never finished (before any save of this start)."""
        ...

    def candidates(self, skip: set[str], *, reported: bool = False) -> list[str]:
        """Checkpoint paths, newest first, without those in ``skip``; ``reported``: the
        directories a loop gave to ``ray.train.report`` instead of rayguard's own."""
        ...

    def choose(self, skip: set[str]) -> tuple[str | None, list[tuple[str, str]]]:
        """The newest checkpoint that verifies, and the (path, why) of the newer ones that did
        not, newest first."""
        ...

    def verify_share(self, path: str, rank: int, world_size: int) -> tuple[tuple[Problem, ...], str]:
        """Verify this rank's share of ``path``: (problems, the local copy to read)."""
        ...

    def materialize(self, path: str) -> Any:
        """A context manager giving a local directory holding the checkpoint ``path``."""
        ...

    def rejected(self) -> dict[str, str]:
        """Rejected checkpoints remembered beside the checkpoints, and why."""
        ...

    def remember_rejection(self, path: str, why: str) -> None:
        ...


class LocalStore:
    """A local or shared filesystem: stage beside the final directory, rename to commit."""

    fs: Any = None
    dcp_data_verified_on_read = True
    """A sharded load verifies the DCP data files as DCP reads them (``verify_share``
    hashes the rest), not in a pass of its own before."""

    def __init__(self, root: str) -> None:
        self.root = root

    def final_path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def taken(self, final: str) -> bool:
        return os.path.lexists(final)  # the staging directory is renamed there last

    @contextmanager
    def stage(self, final: str) -> Iterator[str]:
        from rayguard.checkpoint.commit import prepare_staging

        yield str(prepare_staging(final))

    def upload(self, staged: str, final: str, record: ShardRecord) -> None:
        return None  # already in the shared staging directory

    def staged_names(self, final: str, subdir: str) -> list[str]:
        from rayguard.checkpoint.commit import staging_dir_for

        return os.listdir(staging_dir_for(final) / subdir)

    def commit(self, final: str, records: list[ShardRecord], *, world_size: int, step: int,
               metadata: dict[str, Any]) -> str:
        from rayguard.checkpoint.commit import commit, staging_dir_for

        return str(commit(staging_dir_for(final), final, records, world_size=world_size,
                          step=step, metadata=metadata))

    def discard(self, final: str) -> None:
        from rayguard.checkpoint.commit import discard_staging, staging_dir_for

        discard_staging(staging_dir_for(final))

    def cleanup(self) -> None:
        from rayguard.checkpoint.commit import cleanup_staging

        cleanup_staging(self.root)

    def candidates(self, skip: set[str], *, reported: bool = False) -> list[str]:
        from rayguard.checkpoint.fallback import candidates_of, order_candidates

        skip = {os.path.realpath(p) for p in skip}
        return [str(c.path) for c in order_candidates(candidates_of(self.root, reported=reported))
                if os.path.realpath(c.path) not in skip]

    def choose(self, skip: set[str]) -> tuple[str | None, list[tuple[str, str]]]:
        from rayguard.checkpoint.fallback import scan

        found = scan(self.root, skip=skip)
        rejected = [(r.path, r.describe()) for r in found.rejected]
        return (None if found.chosen is None else str(found.chosen)), rejected

    def verify_share(self, path: str, rank: int, world_size: int) -> tuple[tuple[Problem, ...], str]:
        from rayguard.checkpoint.sharded import verify_share

        return tuple(verify_share(path, rank, world_size, dcp_data=False).problems), path

    @contextmanager
    def materialize(self, path: str) -> Iterator[str]:
        yield path

    def rejected(self) -> dict[str, str]:
        from rayguard.checkpoint import rejections

        return rejections.rejected(self.root)

    def remember_rejection(self, path: str, why: str) -> None:
        from rayguard.checkpoint import rejections

        rejections.reject(path, why)


class RemoteStore:
    """A remote pyarrow filesystem: stage locally, upload, write the manifest last."""

    def __init__(self, root: str, fs: Any) -> None:
        self.root = root
        self.fs = fs

    def final_path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def taken(self, final: str) -> bool:
        import pyarrow.fs as pafs

        # the ranks upload into ``final`` itself: only the manifest, written last, says taken
        info = self.fs.get_file_info(f"{final}/{MANIFEST_NAME}")
        return info.type != pafs.FileType.NotFound

    @contextmanager
    def stage(self, final: str) -> Iterator[str]:
        local = tempfile.mkdtemp(prefix="rayguard-stage-")
        try:
            yield local
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def upload(self, staged: str, final: str, record: ShardRecord) -> None:
        from rayguard.checkpoint.remote import upload_shard

        hashed = {f.path for f in record.files}
        unhashed = sorted(os.path.relpath(os.path.join(d, n), staged)
                          for d, _, names in os.walk(staged) for n in names)
        extra = [p for p in unhashed if p not in hashed]
        if extra:  # this rank's staging is private: a file outside the record would be lost
            raise CheckpointError(f"rank {record.rank}: files were written that no rank hashed "
                                  f"{extra[:5]}")
        upload_shard(staged, final, record, self.fs)

    def staged_names(self, final: str, subdir: str) -> list[str]:
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(f"{final}/{subdir}", allow_not_found=True))
        return [i.base_name for i in infos if i.type == pafs.FileType.File]

    def commit(self, final: str, records: list[ShardRecord], *, world_size: int, step: int,
               metadata: dict[str, Any]) -> str:
        from rayguard.checkpoint.remote import commit_remote

        return commit_remote(final, records, world_size=world_size, step=step,
                             metadata=metadata, fs=self.fs)

    def discard(self, final: str) -> None:
        try:  # no manifest was written, so readers never saw it; tidy up anyway
            self.fs.delete_dir(final)
        except OSError:
            pass

    def cleanup(self) -> None:
        return None  # a directory without a manifest is invisible; nothing to rename away

    def candidates(self, skip: set[str], *, reported: bool = False) -> list[str]:
        from rayguard.checkpoint.remote import list_remote
        from rayguard.checkpoint.reported import REPORTED_SOURCE

        return [c.path for c in list_remote(self.root, self.fs)
                if c.path not in skip and (c.source == REPORTED_SOURCE) == reported]

    def choose(self, skip: set[str]) -> tuple[str | None, list[tuple[str, str]]]:
        from rayguard.checkpoint.verify import verify

        rejected: list[tuple[str, str]] = []
        for path in self.candidates(skip):
            try:
                local = self._download(path)
            except CheckpointCorruptError as exc:
                rejected.append((path, str(exc)))
                continue
            try:
                report = verify(local)
            finally:
                shutil.rmtree(local, ignore_errors=True)
            if report.ok:
                return path, rejected
            problems = "; ".join(f"{p.file}: {p.what}" for p in report.problems)
            rejected.append((path, f"{path}: {problems}"))
        return None, rejected

    def verify_share(self, path: str, rank: int, world_size: int) -> tuple[tuple[Problem, ...], str]:
        from rayguard.checkpoint.verify import verify

        try:
            copy = self._download(path)
        except CheckpointCorruptError as exc:
            return (Problem("rayguard_manifest.json", str(exc)),), ""
        return tuple(verify(copy).problems), copy

    @contextmanager
    def materialize(self, path: str) -> Iterator[str]:
        local = self._download(path)
        try:
            yield local
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def rejected(self) -> dict[str, str]:
        return {}  # the run's coordinator remembers remote rejections

    def remember_rejection(self, path: str, why: str) -> None:
        return None

    def _download(self, path: str, ranks: Sequence[int] | None = None) -> str:
        from rayguard.checkpoint.remote import download

        return download(path, self.fs, ranks)


def is_remote_fs(fs: Any) -> bool:
    """Whether ``fs`` (a pyarrow filesystem or ``None``) is a remote one."""
    from rayguard.checkpoint.remote import is_local

    return not is_local(fs)


def store_for(root: str, fs: Any) -> CheckpointStore:
    """The store for a run directory ``root`` on ``fs`` (``None``/local: :class:`LocalStore`)."""
    return RemoteStore(root, fs) if is_remote_fs(fs) else LocalStore(root)
