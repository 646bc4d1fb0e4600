"""Durable file operations, and the test hooks that make them fail on purpose.

Every byte a checkpoint writes goes through :func:`write_all` (or :func:`atomic_write_bytes`),
so a single hook can inject an I/O error (``ENOSPC``, ``EIO``) at a chosen offset of a chosen
file: :func:`inject_write_error`. :func:`set_phase_hook` lets crash tests kill the process at
a named point of the commit protocol (see ``PHASES``). Both hooks are per worker (held by
its :mod:`rayguard.runtime`; the threads a worker starts see its own) and are ``None`` in
normal runs (one attribute check per write).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from rayguard import runtime
from rayguard.exceptions import CheckpointError

# (path, file offset of this write, number of bytes) -> None, or raise OSError.
WriteFaultHook = Callable[[str, int, int], None]
# (phase name, path it concerns) -> None; a crash test may os.kill itself here.
PhaseHook = Callable[[str, str], None]

PHASES = (
    "shard-opened",  # a rank's shard file exists, empty
    "shard-written",  # a rank's shard is written and fsynced, staging only
    "manifest-written",  # manifest replaced into the staging dir, not yet published
    "published",  # staging renamed to the final directory
)

_MAX_IOV = 1024  # IOV_MAX on Linux


def set_write_fault_hook(hook: WriteFaultHook | None) -> WriteFaultHook | None:
    """Install ``hook`` (called before every checkpoint write syscall); returns the previous one."""
    rt = runtime.current()
    previous, rt.write_fault_hook = rt.write_fault_hook, hook
    return previous


def set_phase_hook(hook: PhaseHook | None) -> PhaseHook | None:
    """Install ``hook`` (called at each point of ``PHASES``); returns the previous one."""
    rt = runtime.current()
    previous, rt.phase_hook = rt.phase_hook, hook
    return previous


def phase(name: str, path: str | os.PathLike[str]) -> None:
    hook = runtime.current().phase_hook
    if hook is not None:
        hook(name, os.fspath(path))


@contextmanager
def inject_write_error(
    err: int = errno.ENOSPC, *, after_bytes: int = 0, path_contains: str = ""
) -> Iterator[None]:
    """Make checkpoint writes fail with ``OSError(err)`` once a file holds ``after_bytes``.

    Only files whose path contains ``path_contains`` are affected. Used by tests and by
    :mod:`rayguard.testing` to simulate a full disk without filling one.
    """

    def hook(path: str, offset: int, nbytes: int) -> None:
        if path_contains in path and offset + nbytes > after_bytes:
            raise OSError(err, os.strerror(err), path)

    previous = set_write_fault_hook(hook)
    try:
        yield
    finally:
        set_write_fault_hook(previous)


def write_all(fd: int, buffers: Sequence[memoryview], path: str, offset: int) -> int:
    """Write every buffer (in order) at the current position of ``fd``; returns bytes written.

    Uses ``writev`` so many small tensors cost one syscall. Handles short writes.
    """
    total = sum(b.nbytes for b in buffers)
    hook = runtime.current().write_fault_hook
    if hook is not None:
        hook(path, offset, total)
    pending = [b for b in buffers if b.nbytes]
    while pending:
        batch = pending[:_MAX_IOV]
        written = os.writev(fd, batch) if len(batch) > 1 else os.write(fd, batch[0])
        if written <= 0:
            raise OSError(errno.EIO, "write returned 0", path)
        pending = _advance(pending, written)
    return total


def _advance(buffers: list[memoryview], nbytes: int) -> list[memoryview]:
    """Drop ``nbytes`` from the front of ``buffers`` (after a possibly short write/read)."""
    i = 0
    while i < len(buffers) and nbytes >= buffers[i].nbytes:
        nbytes -= buffers[i].nbytes
        i += 1
    rest = buffers[i:]
    if rest and nbytes:
        rest[0] = rest[0][nbytes:]
    return rest


def read_exact(fd: int, buffers: Sequence[memoryview], path: str) -> None:
    """Fill every buffer from the current position of ``fd``; EOF first is an error."""
    pending = [b for b in buffers if b.nbytes]
    while pending:
        batch = pending[:_MAX_IOV]
        got = os.readv(fd, batch)
        if got == 0:
            raise EOFError(f"{path}: file ended early (truncated)")
        pending = _advance(pending, got)


def pread_exact(fd: int, buf: memoryview, offset: int, path: str) -> None:
    """Fill ``buf`` from ``offset`` of ``fd``; EOF first is an error."""
    done = 0
    while done < buf.nbytes:
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got == 0:
            raise EOFError(f"{path}: file ended early at byte {offset + done} (truncated)")
        done += got


class NotRegularFileError(OSError):
    """What :func:`read_bounded` raises for a name that is not a regular file (a FIFO, a
    device, a directory, a socket) or, with ``follow=False``, is a symbolic link."""


def open_regular(path: str | os.PathLike[str], *, follow: bool = False) -> int:
    """A read-only descriptor of the regular file at ``path``, opened without blocking
    (``O_NONBLOCK``: a FIFO or a device planted where a file should be never hangs the
    reader) and, unless ``follow``, without following a link (``O_NOFOLLOW``). ``fstat``
    must then say a regular file; anything else raises :class:`NotRegularFileError` (an
    ``OSError``), a missing file ``FileNotFoundError``. The descriptor is the caller's."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFileError(errno.ELOOP, "a symbolic link, not followed",
                                      os.fspath(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"not a regular file ({_kind(mode)})",
                                      os.fspath(path))
        os.set_blocking(fd, True)  # a regular file: reads never block on a writer
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a file"


def read_fd_bounded(fd: int, max_bytes: int) -> bytes:
    """The bytes of the open file ``fd`` from its current position, or its first
    ``max_bytes + 1`` when it is longer (the caller sees it is too long). Allocates only
    what the file holds, not ``max_bytes``."""
    want = min(os.fstat(fd).st_size, max_bytes) + 1
    chunks, got = [], 0
    while got < want:
        piece = os.read(fd, min(want - got, 64 * 1024 * 1024))
        if not piece:
            break
        chunks.append(piece)
        got += len(piece)
    return b"".join(chunks)


def read_bounded(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, or its first ``max_bytes + 1`` when it is
    longer (the caller sees it is too long). Opened by :func:`open_regular`: never through
    a link unless ``follow``, never blocking on a FIFO or a device (those raise
    :class:`NotRegularFileError`, an ``OSError``)."""
    fd = open_regular(path, follow=follow)
    try:
        return read_fd_bounded(fd, max_bytes)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that the names created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""How rayguard creates every file in a run directory: never through a link planted there."""


def create_new(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """Open a new file for writing at ``path`` (``O_EXCL|O_NOFOLLOW``). Whatever is already
    at that name (a stale file, a planted symlink) is unlinked first, never written through."""
    try:
        return os.open(path, NEW_FILE_FLAGS, mode)
    except FileExistsError:
        os.unlink(path)  # removes a link itself, not its target
        return os.open(path, NEW_FILE_FLAGS, mode)


def check_real_dir(path: str | os.PathLike[str], what: str) -> None:
    """Raise CheckpointError unless ``path`` is a directory and not a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise CheckpointError(
            f"{what} {path} is {kind}; refusing to write through it (someone with write "
            "access to the run directory planted it). Fix: remove it and check who can write "
            f"to {Path(path).parent}.")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a new randomly named temporary file beside it
    (``mkstemp``: ``O_EXCL``, never through a link) + fsync + ``os.replace`` + dir fsync."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o644)
            write_all(fd, [memoryview(data)], tmp, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


@contextmanager
def locked(path: str | os.PathLike[str], timeout_s: float = 30.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created ``O_NOFOLLOW``, never
    truncated, so a planted link cannot make it clobber anything)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CheckpointError(f"could not lock {path} within {timeout_s} s; another "
                                          "process holds it") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def io_error(action: str, path: str | os.PathLike[str], exc: OSError) -> CheckpointError:
    """A CheckpointError that names the file, the OS error and what to do about it."""
    where = Path(path).parent
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (
            f"free space on the filesystem holding {where} (df -h {where}), or keep fewer "
            "checkpoints (ray.train.CheckpointConfig(num_to_keep=...)); earlier checkpoints are untouched"
        )
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make {where} writable by this process, or point storage_path elsewhere"
    else:
        fix = "check the filesystem (dmesg, mount options, network storage health) and retry"
    return CheckpointError(f"could not {action} checkpoint file {path}: [Errno {exc.errno}] {exc.strerror}. Fix: {fix}")
