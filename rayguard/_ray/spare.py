"""A warm spare worker process per node, so that a live replacement starts at once.

Under ``GuardConfig(recovery="live")`` most of a replacement's time to its first step is
its own start: a new Python process, then torch and Ray Train imported before the actor
exists (2-3 s on 2 CPUs, more on a busy node). Ray starts an actor in an idle worker
process when one of the same runtime environment was started and never used, so each node
of a live run keeps one:

* the workers' runtime environment (``RunConfig.worker_runtime_env``, set by
  :meth:`rayguard.trainer.RobustTrainer`) names :func:`warm` as Ray's worker-process set-up
  hook, so every process started for it imports torch and Ray Train before it takes work,
  and a run-specific :data:`SPARE_DIR_ENV` (spares of one run are never another's), whose
  folder on each node is private to the run's user (:mod:`rayguard._ray.spare_dir`:
  ``<tmp>/rayguard-spares-<uid>/<run id>``, 0700, checked at every level; a folder another
  user made or opened turns the spare off with one warning, never a worker's start);
* after set-up, the lowest rank of each node writes the names of the modules its process
  has imported (:func:`record_modules`: the user's loop, Transformers or Lightning,
  rayguard's worker modules) and asks its raylet to prestart one process of exactly its own
  runtime environment (:func:`ensure_spare`; Ray's ``PrestartWorkers``, kept alive
  ``KEEP_ALIVE_S``), unless the node has one; the spare, while it runs no actor, imports
  those modules too, so a replacement imports next to nothing before its set-up (a spare
  whose imports made a CUDA call ends itself: it read the GPUs before Ray set
  ``CUDA_VISIBLE_DEVICES``; the run's later spares import no list);
* the process that Ray then gives a replacement is that spare, torch already imported;
  it leaves the spare list at set-up (:func:`claim_process`) and the new attempt's set-up
  prestarts the next one;
* at the end of the run the spares left are ended (:func:`release_spares`); one whose run
  ended otherwise (it failed, its driver was killed) ends itself once no live worker of its
  node has ticked for ``ORPHAN_S`` (:func:`touch`, from each worker's watchdog).

Each spare costs one idle worker process with torch imported (a few hundred MB of host
memory) per node. ``HealthConfig(live_spare=False)`` turns it off. Every call here is best
effort: a spare that cannot be had leaves the replacement to start a new process.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
import uuid

from rayguard import runtime
from rayguard._ray import spare_dir
from rayguard._ray.prestart import KEEP_ALIVE_S, prestart
from rayguard._ray.spare_dir import SPARE_DIR_ENV, base_dir, open_private

logger = logging.getLogger("rayguard")

HOOK = "rayguard._ray.spare.warm"
MODULES_FILE = "modules"
"""In a run's spare directory: the modules a worker of the node had imported after set-up
(one name a line), which a spare imports while it waits."""
CUDA_FILE = "modules.cuda"
"""In a run's spare directory: a spare's import of the module list made a CUDA call; the
later spares import no list."""
FIRST_S = 1.0
"""A new process waits this long before it imports the list: a worker has its actor by
then and imports nothing; a spare is still idle."""
ORPHAN_S = 120.0
"""An unused spare whose run's workers on its node have not ticked this long ends itself."""

POLL_S = 5.0
"""How often an unused spare looks at its run's directory."""
UNLISTED_S = 10.0
"""A process that found no run folder at its start and still runs no actor this long after
is a spare whose run ended on its node: it ends itself (a new worker has its actor by then)."""

_claimed = threading.Event()  # per process: whether this process is a spare no more

def spare_env() -> dict[str, str]:
    """The worker environment variables of a live run with a spare (the driver sets them;
    each node keeps the run's folder under its own user's base, by the run id)."""
    from ray._private import ray_constants

    path = os.path.join(base_dir(), uuid.uuid4().hex[:16])
    return {SPARE_DIR_ENV: path, ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR: HOOK}


def has_setup_hook(env_vars: dict[str, str]) -> bool:
    """Whether the user's job or worker environment has its own worker-process set-up hook
    (then it stays theirs, and the run keeps no spare process)."""
    import ray
    from ray._private import ray_constants

    key = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    if key in env_vars:
        return True
    if not ray.is_initialized():
        return False
    job_env = ray.get_runtime_context().runtime_env.get("env_vars") or {}
    return key in job_env


def warm() -> None:
    """Ray's worker-process set-up hook: import what a Train worker imports (torch and Ray
    Train), then join the run's spare list (a process that becomes a worker leaves it at
    once); an idle one goes on to import what a worker of the run imported
    (:func:`record_modules`). Never raises: a spare that cannot be had is only a slower
    replacement."""
    import ray.train.torch  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    value = os.environ.get(SPARE_DIR_ENV)
    if not value:
        return
    try:
        # The folder is made by the node's first worker (record_modules) before it asks for
        # a spare, and removed at the run's end: never made here, or a spare that starts
        # after the run ended on its node would make it again and wait for ORPHAN_S.
        fd = open_private(value)
        listed = fd is not None
        if fd is not None:
            try:
                spare_dir.create(fd, str(os.getpid()))
            finally:
                os.close(fd)
        threading.Thread(target=_outlive_no_run, args=(value, listed), name="rayguard-spare",
                         daemon=True).start()
    except Exception as exc:  # noqa: BLE001 - Ray's set-up hook must not fail the worker
        spare_dir.spare_off(f"its folder could not be set up ({exc})")


def _outlive_no_run(value: str, listed: bool = True) -> None:
    """While this process runs no actor (a spare), it imports what the run's workers
    imported (:func:`record_modules`; first ``FIRST_S`` after its start, then whenever the
    list changes), and ends itself once its run is over on this node: the folder gone
    (:func:`release_spares`), or not touched by a live worker for ``ORPHAN_S`` (the run
    failed, or its driver went). A process that Ray gives an actor at once (a new worker)
    imports nothing here. One that found no folder at its start (``listed`` False: a new
    worker of the run's first attempt on the node, or a spare that started after the run's
    end) ends itself if it is still idle and the folder still missing ``UNLISTED_S`` on."""
    seen, wait_s = None, FIRST_S if listed else UNLISTED_S
    while not _claimed.is_set():
        time.sleep(wait_s)
        wait_s = POLL_S
        if _claimed.is_set() or not _idle():
            return
        fd = open_private(value)
        if fd is None:  # released (or no longer ours): nothing to wait for
            os._exit(0)
        try:
            if not listed:  # made since: the run goes on here, and this is its spare
                listed = True
                spare_dir.create(fd, str(os.getpid()))
            now = spare_dir.mtime(fd, MODULES_FILE)
            if now != seen:  # a worker imported more: so does the spare
                seen = now
                _import_list(fd)
            idle = time.time() - os.fstat(fd).st_mtime
            if idle > ORPHAN_S:
                spare_dir.leave(fd)
                spare_dir.remove(value)  # the last one out (fails while others are listed)
                os._exit(0)
        finally:
            os.close(fd)


_NEVER_IMPORTED = frozenset({"__main__", "__mp_main__", "pytest", "_pytest", "py", "pluggy",
                             "antigravity", "this"})


def _importable(name: str) -> bool:
    """A module a spare may import by name: a dotted identifier, not a script's ``__main__``
    (run, not imported), nor a test runner's, nor one whose import acts (opens a browser,
    prints)."""
    top = name.partition(".")[0]
    return (bool(spare_dir.MODULE_NAME.fullmatch(name)) and top not in _NEVER_IMPORTED
            and not top.startswith("__"))


def record_modules(value: str | None = None) -> None:
    """A worker after set-up (the lowest rank of its node): the modules its process has
    imported, for the node's next spares (written whole into a new private file, then
    renamed: a spare never reads half of it); :func:`touch` records them again when the
    loop has imported more (a loop that imports Transformers in its body)."""
    value = value or os.environ.get(SPARE_DIR_ENV)
    if not value:
        return
    runtime.current().spare_recorded = len(sys.modules)  # touch() records again on a change
    names = sorted(n for n in list(sys.modules) if _importable(n))
    try:
        fd = open_private(value, create=True)
        if fd is None:
            return
        try:
            spare_dir.replace(fd, MODULES_FILE, "\n".join(names).encode())
        finally:
            os.close(fd)
    except OSError as exc:  # best effort: the spare then imports only torch and Ray Train
        logger.debug("rayguard: the spare's module list was not written: %s", exc)


def _idle() -> bool:
    """This process runs no actor (yet): a spare. Ray gives a worker its actor right after
    its start, so a worker's thread stops before it imports the list."""
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is None
    except Exception:
        return False


def _cuda_loaded() -> bool:
    """Whether this process has the CUDA driver library mapped (a CUDA call was made)."""
    try:
        with open("/proc/self/maps") as f:
            return "libcuda.so" in f.read()
    except OSError:
        return False


def _import_list(fd: int) -> None:
    """Import the recorded modules. If one of them made a CUDA call on import, this process
    has read the node's GPUs before Ray set its ``CUDA_VISIBLE_DEVICES``: it must never
    become a worker. It ends itself, and the run's later spares import no list
    (:data:`CUDA_FILE`, only when it is this user's regular file)."""
    if spare_dir.owned_file(fd, CUDA_FILE):
        return
    before = _cuda_loaded()
    _import_names(fd)
    if before or not _cuda_loaded():
        return
    logger.warning("rayguard: a module the workers imported initialises CUDA when imported; "
                   "the run's spare processes import only torch and Ray Train from now on")
    try:
        spare_dir.create(fd, CUDA_FILE)
    except OSError:
        pass
    if _idle() and not _claimed.is_set():
        try:
            spare_dir.leave(fd)
        finally:
            os._exit(0)


def import_recorded(value: str) -> int:
    """Import the modules :func:`record_modules` listed in the run's folder (``value``: its
    :data:`SPARE_DIR_ENV`); each best effort: one that fails is left to the worker that
    needs it; none once this process is claimed or runs an actor. Returns how many were
    imported now."""
    fd = open_private(value)
    if fd is None:
        return 0
    try:
        return _import_names(fd)
    finally:
        os.close(fd)


def _import_names(fd: int) -> int:
    """Import the names of the folder's list: read only when it is this user's regular file
    (no link followed, no FIFO waited on), only dotted identifiers."""
    data = spare_dir.read_own(fd, MODULES_FILE)
    if data is None:
        return 0
    imported = 0
    for name in spare_dir.module_names(data):
        if _claimed.is_set() or not _idle():
            break
        if name in sys.modules or not _importable(name):
            continue
        try:
            importlib.import_module(name)
            imported += 1
        except BaseException as exc:  # noqa: BLE001 - an import may even sys.exit(); never fatal here
            if isinstance(exc, KeyboardInterrupt):
                raise
            logger.debug("rayguard: the spare did not import %s: %s", name, exc)
    return imported


def touch(value: str | None = None) -> None:
    """A live worker's tick: the run still holds this node's spare (and the node's recording
    rank records its modules again if it has imported more)."""
    value = value or os.environ.get(SPARE_DIR_ENV)
    if not value:
        return
    fd = open_private(value)
    if fd is not None:
        try:
            os.utime(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    if 0 <= runtime.current().spare_recorded != len(sys.modules):
        record_modules(value)


def claim_process() -> None:
    """This process runs a Train worker: it is no spare."""
    _claimed.set()
    fd = open_private(os.environ.get(SPARE_DIR_ENV))
    if fd is not None:
        try:
            spare_dir.leave(fd)
        finally:
            os.close(fd)


def idle_spares(value: str | None = None) -> list[int]:
    """The pids of this node's unused spares of the run: entries naming a Ray worker process
    of this user that carries the run's folder (the others, stale or planted, are dropped)."""
    value = value or os.environ.get(SPARE_DIR_ENV)
    fd = open_private(value) if value else None
    if fd is None or value is None:
        return []
    alive = []
    try:
        for name in os.listdir(fd):
            if not name.isdigit() or not spare_dir.owned_file(fd, name):
                continue
            pid = int(name)
            if spare_dir.is_our_spare(pid, value):
                alive.append(pid)
            else:
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
    finally:
        os.close(fd)
    return sorted(alive)


def ensure_spare(after_s: float = 0.0) -> bool:
    """One spare on this node, asked for ``after_s`` from now (the attempt's set-up; see
    ``HealthConfig.live_spare_after_s``) unless the node has one by then or the run has
    ended on it (its folder removed). True: one was asked for."""
    value = os.environ.get(SPARE_DIR_ENV)
    if not value:
        return False
    if after_s > 0:
        time.sleep(after_s)
    fd = open_private(value)
    if fd is None:  # the run's end on this node (release_spares) came first
        return False
    os.close(fd)
    if idle_spares(value):
        return False
    return prestart()


def release_spares(value: str | None = None) -> int:
    """End this node's unused spares of the run (only Ray worker processes of this user that
    carry the run's folder); remove the folder's entries, then the folder. Returns how
    many were ended."""
    value = value or os.environ.get(SPARE_DIR_ENV)
    ended = 0
    for pid in idle_spares(value):
        try:
            os.kill(pid, signal.SIGTERM)
            ended += 1
        except OSError:
            pass
    spare_dir.remove(value, clear=True)  # a spare still starting sees it gone and ends itself
    return ended


__all__ = ["CUDA_FILE", "FIRST_S", "HOOK", "KEEP_ALIVE_S", "MODULES_FILE", "ORPHAN_S",
           "SPARE_DIR_ENV", "UNLISTED_S", "claim_process", "ensure_spare", "has_setup_hook",
           "idle_spares", "import_recorded", "touch", "prestart", "record_modules",
           "release_spares", "spare_env", "warm"]
