"""The warm spares' private folder on a node, opened so that no other user can steer it.

The spares of a run live in ``<tmp>/rayguard-spares-<uid>/<run id>/`` (:func:`base_dir`):
one empty file per waiting spare (named by its pid), the module list (``modules``) and the
CUDA marker (``modules.cuda``). The shared temporary directory is writable by every local
user, so every level is checked before use (:func:`open_private`): a directory (not a link),
owned by this user, with no group or world bits; what this process creates is made 0700.
Anything else turns the spare off for this process (one warning: :func:`spare_off`), never
fails a worker's start. Inside the folder every file is opened relative to the folder's
descriptor, ``O_NOFOLLOW``, created ``O_EXCL`` (:func:`create`), read ``O_NONBLOCK`` with a
bound (:func:`read_own`); a process is signalled only when it is this user's and carries
this run's folder in its environment (:func:`is_our_spare`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import tempfile
from contextlib import suppress

from rayguard.checkpoint.fsio import read_fd_bounded

logger = logging.getLogger("rayguard")

BASE_PREFIX = "rayguard-spares-"
MAX_LIST_BYTES = 4 << 20
"""The longest module list read (a worker with Transformers imported lists ~5,000 names)."""
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
"""What a listed name must be to be imported: dotted Python identifiers, nothing else."""
SPARE_DIR_ENV = "RAYGUARD_SPARE_DIR"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_warned: set[str] = set()  # per process: each reason is said once per process


def base_dir() -> str:
    """This user's spares folder in the node's temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"{BASE_PREFIX}{os.getuid()}")


def spare_off(why: str) -> None:
    """Say once per process why this process keeps no spare (a replacement then starts a
    new process, as without spares)."""
    if why not in _warned:
        _warned.add(why)
        logger.warning("rayguard: no warm spare on this node: %s", why)


def _private(fd: int, where: str) -> str | None:
    """Why the opened folder ``fd`` is not private to this user (``None``: it is)."""
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is not a folder"
    if st.st_uid != os.getuid():
        return f"{where} belongs to uid {st.st_uid}, not this user ({os.getuid()})"
    if st.st_mode & 0o077:
        return (f"{where} is open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
                f"remove it (rm -r {where}) or make it 0700")
    return None


def _open_dir(name: str, where: str, *, dir_fd: int | None, create: bool) -> int | None:
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT and not create:
            return None
        what = "a link or not a folder" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
        spare_off(f"{where} cannot be used ({what}); remove it, or check who made it")
        return None
    why = _private(fd, where)
    if why is not None:
        os.close(fd)
        spare_off(why)
        return None
    return fd


RUN_ID = re.compile(r"[0-9a-f]{8,64}")


def run_folder(value: str | None) -> str | None:
    """This node's folder of the run whose :data:`SPARE_DIR_ENV` is ``value``: the run id
    (its last part) under this user's own base on this node, whatever base the driver's
    node named (``None``: no spare, or not a run id)."""
    if not value:
        return None
    run_id = os.path.basename(os.path.normpath(value))
    if not RUN_ID.fullmatch(run_id):
        spare_off(f"{SPARE_DIR_ENV}={value!r} does not name a run's spares folder")
        return None
    return os.path.join(base_dir(), run_id)


def open_private(value: str | None, *, create: bool = False) -> int | None:
    """A descriptor of the run's spares folder (:func:`run_folder` of ``value``), after
    checking it and its base (and making both 0700 when ``create``); ``None`` when it is
    missing or not this user's private folder (the spare is then off)."""
    directory = run_folder(value)
    if directory is None:
        return None
    parent, name = os.path.split(directory)
    try:
        base = _open_dir(parent, parent, dir_fd=None, create=create)
        if base is None:
            return None
        try:
            return _open_dir(name, directory, dir_fd=base, create=create)
        finally:
            os.close(base)
    except OSError as exc:
        spare_off(f"{directory} cannot be used ({exc})")
        return None


def create(dir_fd: int, name: str, data: bytes = b"") -> None:
    """Create ``name`` in the folder anew (a stale entry is unlinked first; never written
    through a link) holding ``data``, mode 0600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(name, dir_fd=dir_fd)
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def replace(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` whole, through a new private file renamed over it (a reader never
    sees half of it)."""
    part = f".{name}.{os.getpid()}"
    create(dir_fd, part, data)
    os.replace(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def owned_file(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is a regular file of this user (not a link) in the folder."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def read_own(dir_fd: int, name: str, max_bytes: int = MAX_LIST_BYTES) -> bytes | None:
    """The bytes of ``name`` when it is a regular file of this user, opened without
    following a link or blocking on a FIFO and read up to ``max_bytes`` (``None``:
    anything else, or longer)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        data = read_fd_bounded(fd, max_bytes)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def mtime(dir_fd: int, name: str) -> float | None:
    """When ``name`` in the folder last changed (``None``: it is not there)."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return None


def leave(dir_fd: int) -> None:
    """This process's entry leaves the folder's list of spares."""
    with suppress(OSError):
        os.unlink(str(os.getpid()), dir_fd=dir_fd)


def remove(value: str | None, *, clear: bool = False) -> None:
    """Remove the run's folder, relative to its checked base (``clear``: its entries first,
    each unlinked itself, never a link's target; else only once it is empty)."""
    directory = run_folder(value)
    if directory is None:
        return
    parent, name = os.path.split(directory)
    with suppress(OSError):
        base = _open_dir(parent, parent, dir_fd=None, create=False)
        if base is None:
            return
        try:
            fd = _open_dir(name, directory, dir_fd=base, create=False) if clear else None
            if fd is not None:
                try:
                    for entry in os.listdir(fd):
                        with suppress(OSError):
                            os.unlink(entry, dir_fd=fd)
                finally:
                    os.close(fd)
            os.rmdir(name, dir_fd=base)
        finally:
            os.close(base)


def module_names(data: bytes) -> list[str]:
    """The names of a module list that may be imported: one a line, each line a dotted
    identifier and nothing else (a line such as ``os; import evil`` is skipped whole)."""
    lines = (line.strip() for line in data.decode("utf-8", "replace").splitlines())
    return [line for line in lines if MODULE_NAME.fullmatch(line)]


def is_ray_worker(pid: int) -> bool:
    """Whether ``pid`` is (still) a Ray worker process: its title (``ray::IDLE`` once it
    waits for work) or its command line (``default_worker.py`` while it starts)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read(4096)
    except OSError:
        return False
    return line.startswith(b"ray::") or b"default_worker" in line


def is_our_spare(pid: int, value: str) -> bool:
    """Whether process ``pid`` is a Ray worker of this user that carries this run's
    :data:`SPARE_DIR_ENV` (``value``) in its environment (a pid file may name any process:
    it is only signalled when all three hold)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid() or not is_ray_worker(pid):
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read(MAX_LIST_BYTES)
    except OSError:
        return False
    return f"{SPARE_DIR_ENV}={value}".encode() in environ.split(b"\0")


__all__ = ["BASE_PREFIX", "MODULE_NAME", "SPARE_DIR_ENV", "base_dir", "create", "is_our_spare",
           "is_ray_worker", "leave", "module_names", "mtime", "open_private", "owned_file",
           "read_own", "remove", "replace", "run_folder", "spare_off"]
