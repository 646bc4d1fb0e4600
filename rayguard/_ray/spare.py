"""A warm spare worker process per node, so that a live replacement starts at once.

Under ``GuardConfig(recovery="live")`` most of a replacement's time to its first step is
its own start: a new Python process, then torch and Ray Train imported before the actor
exists (2-3 s on 2 CPUs, more on a busy node). Ray starts an actor in an idle worker
process when one of the same runtime environment was started and never used, so each node
of a live run keeps one:

* the workers' runtime environment (``RunConfig.worker_runtime_env``, set by
  :meth:`rayguard.trainer.RobustTrainer`) names :func:`warm` as Ray's worker-process set-up
  hook, so every process started for it imports torch and Ray Train before it takes work,
  and a run-specific :data:`SPARE_DIR_ENV` (spares of one run are never another's);
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

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid

logger = logging.getLogger("rayguard")

SPARE_DIR_ENV = "RAYGUARD_SPARE_DIR"
"""The node-local directory of a run's spares (one empty file per process, named by its
pid); also what makes the run's worker runtime environment its own."""

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

_claimed = threading.Event()

KEEP_ALIVE_S = 600
"""Ray keeps an unused prestarted process at least this long; a run that ends without its
clean-up (its driver killed) leaves its spare no longer."""


def spare_env() -> dict[str, str]:
    """The worker environment variables of a live run with a spare (the driver sets them)."""
    from ray._private import ray_constants

    path = os.path.join(tempfile.gettempdir(), "rayguard-spares", uuid.uuid4().hex[:16])
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
    (:func:`record_modules`)."""
    import ray.train.torch  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    directory = os.environ.get(SPARE_DIR_ENV)
    if directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(os.path.join(directory, str(os.getpid())), "w"):
            pass
        threading.Thread(target=_outlive_no_run, args=(directory,), name="rayguard-spare",
                         daemon=True).start()


def _outlive_no_run(directory: str) -> None:
    """While this process runs no actor (a spare), it imports what the run's workers
    imported (:func:`record_modules`; first ``FIRST_S`` after its start, then whenever the
    list changes), and ends itself once its run is over on this node: the directory gone
    (:func:`release_spares`), or not touched by a live worker for ``ORPHAN_S`` (the run
    failed, or its driver went). A process that Ray gives an actor at once (a new worker)
    imports nothing here."""
    modules = os.path.join(directory, MODULES_FILE)
    seen, wait_s = None, FIRST_S
    while not _claimed.is_set():
        time.sleep(wait_s)
        wait_s = POLL_S
        if _claimed.is_set() or not _idle():
            return
        if (now := _mtime(modules)) != seen:  # a worker imported more: so does the spare
            seen = now
            _import_list(directory)
        try:
            idle = time.time() - os.stat(directory).st_mtime
        except OSError:
            idle = float("inf")
        if idle > ORPHAN_S:
            try:
                os.unlink(os.path.join(directory, str(os.getpid())))
                os.rmdir(directory)  # the last one out (fails while others are listed)
            except OSError:
                pass
            os._exit(0)


_NEVER_IMPORTED = frozenset({"__main__", "__mp_main__", "pytest", "_pytest", "py", "pluggy",
                             "antigravity", "this"})


def _importable(name: str) -> bool:
    """A module a spare may import by name: not a script's ``__main__`` (run, not imported),
    nor a test runner's, nor one whose import acts (opens a browser, prints)."""
    top = name.partition(".")[0]
    return bool(name) and top not in _NEVER_IMPORTED and not top.startswith("__")


_recorded = [-1]
"""How many modules this process had when it last recorded them (-1: it does not record:
only the lowest rank of a node does, from its set-up on)."""


def record_modules(directory: str | None = None) -> None:
    """A worker after set-up (the lowest rank of its node): the modules its process has
    imported, for the node's next spares (written whole, then renamed: a spare never reads
    half of it); :func:`touch` records them again when the loop has imported more (a loop
    that imports Transformers in its body)."""
    import sys

    directory = directory or os.environ.get(SPARE_DIR_ENV)
    if not directory:
        return
    _recorded[0] = len(sys.modules)
    names = sorted(n for n in list(sys.modules) if _importable(n))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        part = os.path.join(directory, f".{MODULES_FILE}.{os.getpid()}")
        with open(part, "w") as f:
            f.write("\n".join(names))
        os.replace(part, os.path.join(directory, MODULES_FILE))
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


def _import_list(directory: str) -> None:
    """Import the recorded modules. If one of them made a CUDA call on import, this process
    has read the node's GPUs before Ray set its ``CUDA_VISIBLE_DEVICES``: it must never
    become a worker. It ends itself, and the run's later spares import no list
    (:data:`CUDA_FILE`)."""
    if os.path.exists(os.path.join(directory, CUDA_FILE)):
        return
    before = _cuda_loaded()
    import_recorded(directory)
    if before or not _cuda_loaded():
        return
    logger.warning("rayguard: a module the workers imported initialises CUDA when imported; "
                   "the run's spare processes import only torch and Ray Train from now on")
    try:
        with open(os.path.join(directory, CUDA_FILE), "w"):
            pass
    except OSError:
        pass
    if _idle() and not _claimed.is_set():
        try:
            os.unlink(os.path.join(directory, str(os.getpid())))
        finally:
            os._exit(0)


def import_recorded(directory: str) -> int:
    """Import the modules :func:`record_modules` listed (each best effort: one that fails is
    left to the worker that needs it; none once this process is claimed or runs an actor);
    returns how many were imported now."""
    import importlib
    import sys

    try:
        with open(os.path.join(directory, MODULES_FILE)) as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():  # only this user's workers list
                return 0
            names = f.read().split()
    except OSError:
        return 0
    imported = 0
    for name in names:
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


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def touch(directory: str | None = None) -> None:
    """A live worker's tick: the run still holds this node's spare (and the node's recording
    rank records its modules again if it has imported more)."""
    import sys

    directory = directory or os.environ.get(SPARE_DIR_ENV)
    if directory:
        try:
            os.utime(directory)
        except OSError:
            pass
        if 0 <= _recorded[0] != len(sys.modules):
            record_modules(directory)


def claim_process() -> None:
    """This process runs a Train worker: it is no spare."""
    _claimed.set()
    directory = os.environ.get(SPARE_DIR_ENV)
    if directory:
        try:
            os.unlink(os.path.join(directory, str(os.getpid())))
        except OSError:
            pass


def _is_ray_worker(pid: int) -> bool:
    """Whether ``pid`` is (still) a Ray worker process: its title (``ray::IDLE`` once it
    waits for work) or its command line (``default_worker.py`` while it starts)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
    except OSError:
        return False
    return line.startswith(b"ray::") or b"default_worker" in line


def idle_spares(directory: str | None = None) -> list[int]:
    """The pids of this node's unused spares of the run (stale entries are dropped)."""
    directory = directory or os.environ.get(SPARE_DIR_ENV)
    if not directory or not os.path.isdir(directory):
        return []
    alive = []
    for name in os.listdir(directory):
        if not name.isdigit():
            continue
        if _is_ray_worker(int(name)):
            alive.append(int(name))
        else:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
    return sorted(alive)


def prestart(keep_alive_s: int = KEEP_ALIVE_S) -> bool:
    """Ask this node's raylet for one idle worker process of this worker's own runtime
    environment (False: it could not be asked)."""
    try:
        import ray
        from ray._private.grpc_utils import init_grpc_channel
        from ray._private.utils import ProtoRuntimeEnvInfo
        from ray.core.generated import common_pb2
        from ray.core.generated import node_manager_pb2 as pb
        from ray.core.generated import node_manager_pb2_grpc as pb_grpc
        from ray.runtime_env import RuntimeEnvConfig

        context = ray.get_runtime_context()
        me = context.get_node_id()
        node = next(n for n in ray.nodes() if n.get("NodeID") == me)
        info = ProtoRuntimeEnvInfo(serialized_runtime_env=context.get_runtime_env_string())
        info.runtime_env_config.CopyFrom(
            RuntimeEnvConfig.default_config().build_proto_runtime_env_config())
        request = pb.PrestartWorkersRequest(  # type: ignore[attr-defined]
            language=common_pb2.PYTHON,  # type: ignore[attr-defined]
            job_id=bytes.fromhex(context.get_job_id()),
            runtime_env_info=info, keep_alive_duration_secs=int(keep_alive_s), num_workers=1)
        channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
        try:
            pb_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=10)
        finally:
            channel.close()
        return True
    except Exception as exc:  # best effort: a replacement then starts a new process
        logger.debug("rayguard: no spare worker process prestarted: %s", exc)
        return False


def ensure_spare() -> bool:
    """One spare on this node (True: one was asked for now)."""
    if not os.environ.get(SPARE_DIR_ENV) or idle_spares():
        return False
    return prestart()


def release_spares(directory: str | None = None) -> int:
    """End this node's unused spares of the run; returns how many."""
    directory = directory or os.environ.get(SPARE_DIR_ENV)
    ended = 0
    for pid in idle_spares(directory):
        try:
            os.kill(pid, signal.SIGTERM)
            ended += 1
        except OSError:
            pass
        try:
            os.unlink(os.path.join(str(directory), str(pid)))
        except OSError:
            pass
    if directory:  # a spare still starting sees it gone and ends itself
        shutil.rmtree(directory, ignore_errors=True)
    return ended


__all__ = ["CUDA_FILE", "FIRST_S", "HOOK", "KEEP_ALIVE_S", "MODULES_FILE", "ORPHAN_S",
           "SPARE_DIR_ENV", "claim_process", "ensure_spare", "has_setup_hook", "idle_spares",
           "import_recorded", "touch", "prestart", "record_modules", "release_spares",
           "spare_env", "warm"]
