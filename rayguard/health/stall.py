"""What a worker does when its watchdog finds it stalled, and what feeds the watchdog.

On a stall (the watchdog's thread, :mod:`rayguard.health.watchdog`): the coordinated hang
diagnosis first (:class:`~rayguard.health.hang.HangProbe`: open it or join a peer's, answer,
wait for the one ``hang_diagnosed`` decision), then leave the cause with the run (the
controller reads it after this worker is gone), dump every thread's stacks, record
``stall_detected`` (the rank that opened the diagnosis, or a rank alone) and SIGKILL the
worker; Ray Train then restarts the group. Every
``optimizer.step()`` of the process is a heartbeat (:func:`watch_optimizer_steps`). No
import of :mod:`rayguard.train`: the worker's link and place are passed in.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rayguard.health.decisions import Decision
from rayguard.run.facts import cause_key, killed_key

if TYPE_CHECKING:
    from rayguard.health.hang import HangProbe

logger = logging.getLogger("rayguard")


class Place(Protocol):
    """Where a worker runs (a :class:`~rayguard.train.context.GuardContext`)."""

    rank: int
    attempt: int
    node_id: str
    run_dir: str


class StallResponder:
    """The watchdog's ``on_stall`` for one worker: ``link`` (a
    :class:`~rayguard.run.link.RunLink`) takes the marks and the event; ``last_step`` reads
    the loop's last step; ``local_run_dir``: the stacks go into the run directory (else a
    private temporary directory of the node); ``probe``: the coordinated hang diagnosis
    (``None``: this rank acts alone)."""

    def __init__(self, link: Any, *, last_step: Callable[[], int], local_run_dir: bool,
                 kill: Callable[[], None] | None = None, probe: HangProbe | None = None) -> None:
        self.link = link
        self.last_step = last_step
        self.local_run_dir = local_run_dir
        self.probe = probe
        self._kill = kill or (lambda: os.kill(os.getpid(), signal.SIGKILL))

    def __call__(self, decision: Decision) -> None:
        """Runs in the watchdog thread: diagnose with the peers, dump stacks, record, end
        this worker."""
        ctx = self.link.ctx
        try:
            opened, diagnosis = self.probe.on_own_stall() if self.probe else (True, None)
        except Exception as exc:  # the diagnosis must never keep a stuck rank alive
            logger.warning("rayguard: hang diagnosis failed: %s", exc)
            opened, diagnosis = True, None
        self.link.mark(cause_key(ctx.attempt, ctx.rank), f"killed by rayguard: {decision.check}")
        self.link.mark(killed_key(ctx.attempt, ctx.rank), decision.reason)
        try:
            if not opened:  # a peer opened the diagnosis and recorded the stall
                return
            path = (self.probe.stacks if self.probe and self.probe.stacks
                    else dump_stacks(ctx, local_run_dir=self.local_run_dir))
            detail = f"{decision.reason}; stacks in {path}" if path else decision.reason
            extra: dict[str, Any] = {}
            if diagnosis:
                detail += f"; hang diagnosed: {diagnosis.get('detail')}"
                extra["culprits"] = diagnosis.get("culprits")
            self.link.record("stall_detected", detail, step=self.last_step(), wait=True,
                             timeout_s=decision.threshold, bound=decision.check, stacks=path,
                             **_idle(decision), **extra)
        finally:
            self._kill()


def _idle(decision: Decision) -> dict[str, float]:
    """``idle_s`` (no progress for) and ``last_progress_time`` (wall clock): the stall's
    measured length, for goodput (the timeout is its lower bound)."""
    verdict = decision.verdict
    if verdict is None or not isinstance(verdict.value, (int, float)) \
            or not isinstance(verdict.time, (int, float)):
        return {}
    return {"idle_s": float(verdict.value),
            "last_progress_time": float(verdict.time) - float(verdict.value)}


def watch_optimizer_steps(heartbeat: Any, counted: Callable[[], None] | None = None) -> Any:
    """Every ``optimizer.step()`` in this process is progress for the watchdog (a heartbeat;
    not a step: the step timer measures reports). A framework loop that reports only at its
    saves or epoch ends (Transformers, Lightning) is then seen alive between its reports, and
    ``counted()`` counts its optimizer steps between them (the replay after a restore is
    then counted in optimizer steps). Returns the hook's handle (``None`` where torch has no
    global optimizer hook)."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:  # pragma: no cover - torch >= 2.4 has it
        return None

    def stepped(*args: Any, **kwargs: Any) -> None:
        heartbeat()
        if counted is not None:
            counted()

    return register_optimizer_step_post_hook(stepped)


def dump_stacks(ctx: Place, *, local_run_dir: bool = True) -> str | None:
    """Write the stacks of every thread of this worker into ``<run_dir>/rayguard_stacks``
    when that folder is ours (:func:`stacks_folder`), else (another user's folder, a link,
    remote storage) into a fresh private directory, ``mkdtemp`` mode 0700, in the node's
    temporary directory; the event names the file and the node. The file is created 0600
    with O_CREAT|O_EXCL|O_NOFOLLOW in the folder's descriptor: never through a link."""
    name = f"rank{ctx.rank}-attempt{ctx.attempt}-{int(time.time())}-{os.getpid()}.txt"
    try:
        directory, dir_fd = stacks_folder(ctx.run_dir if local_run_dir else None)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "w") as f:
            _write_stacks(f, ctx)
        return os.path.join(directory, name)
    except Exception as exc:  # a failed dump must not stop the restart
        logger.warning("rayguard: could not dump stacks: %s", exc)
        return None


def stacks_folder(run_dir: str | None) -> tuple[str, int]:
    """The folder for stack dumps and a descriptor of it: ``<run_dir>/rayguard_stacks``
    (created 0700) when it is a directory, not a link, owned by this user and writable by
    no one else (``mode & 0o022 == 0``); else (or ``run_dir`` ``None``) a fresh private
    ``tempfile.mkdtemp``. The checks are made on the opened descriptor (no race with a
    rename)."""
    import tempfile

    if run_dir is not None:
        folder = os.path.join(run_dir, "rayguard_stacks")
        try:
            os.makedirs(run_dir, exist_ok=True)
            if not os.path.lexists(folder):
                os.mkdir(folder, 0o700)
            fd = _own_private_dir(folder)
            if fd is not None:
                return folder, fd
        except OSError as exc:
            logger.warning("rayguard: stacks not dumped into %s (%s)", folder, exc)
    folder = tempfile.mkdtemp(prefix="rayguard_stacks-")
    return folder, os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _own_private_dir(folder: str) -> int | None:
    """A descriptor of ``folder`` when it is a directory (not a link) of this user that no
    one else can write; ``None`` (with a warning) when it is not."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o022 == 0:
        return fd
    os.close(fd)
    logger.warning("rayguard: %s is not a private folder of this user (owner uid %d, mode %o); "
                   "stacks go to a private temporary folder. Fix: remove it, or chmod go-w "
                   "it as its owner", folder, st.st_uid, stat.S_IMODE(st.st_mode))
    return None


def _write_stacks(f: Any, ctx: Place) -> None:
    """Every thread's Python stacks, then py-spy's native ones where py-spy is installed."""
    import faulthandler
    import shutil
    import subprocess

    f.write(f"# rank {ctx.rank} pid {os.getpid()} node {ctx.node_id}: Python stacks\n")
    f.flush()
    faulthandler.dump_traceback(file=f, all_threads=True)
    py_spy = shutil.which("py-spy")
    if py_spy:
        f.write("\n# native + Python stacks (py-spy dump --native)\n")
        f.flush()
        proc = subprocess.run([py_spy, "dump", "--native", "--pid", str(os.getpid())],
                              capture_output=True, text=True, timeout=20)
        f.write(proc.stdout or proc.stderr)
