"""One worker's mutable state, in one object per worker: :class:`WorkerRuntime`.

What a worker sets while it runs and reads back later lives here, not in module globals, so
that two workers in one process (a test harness, threads) do not see each other's:

* the session and the context (``rayguard.train.session``/``context``);
* the checkpoint hash scheme and key its writers use (``checkpoint.schemes``/``auth``);
* the file-system test hooks (``checkpoint.fsio``);
* the data a restore leaves out, until the sampler takes it (``health.divergence``);
* the memory tier's keepers, pending registrations and their executor
  (``train.memory_tier``), and its peer-copy request and thread (``train.memory_peer``);
* whether this worker records the node's modules for the spares (``_ray.spare``).

:func:`current` is the runtime bound to the calling context (a :class:`~contextvars.ContextVar`),
else the process's default one. Set-up runs the training function inside :func:`worker`; a
harness that runs several workers in one process may :func:`bind` one per worker. A thread does
not inherit its starter's context: every thread or pool task rayguard starts in a worker runs
through :func:`carry` (or is a :func:`pool`'s), so it sees the runtime of the code that
started it.

What stays per process, by its nature (each module says so where it keeps it): Ray's
serializer registration and the receive policy set with it (``serialization.register``,
``codec``, ``policy``, ``receipt``: Ray keeps one dispatch table per process and decodes in its
own threads), the SIGTERM handler (``train.preemption``: signals are per process), whether
this process is a claimed spare (``_ray.spare``), the exit hook and warnings said once per
process (``_ray.console``, ``_ray.spare_dir``), torch's collective counter (``_torch.counting``:
it wraps torch's functions), and caches of file descriptors or buffers (``serialization.cow``,
``checkpoint.file_digests``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(eq=False)
class WorkerRuntime:
    """The mutable state of one worker (typed loosely: this module is at the bottom of the
    import graph and names none of the classes it holds)."""

    session: Any = None
    """The ``WorkerSession`` a training function's ``report``/``load_state`` act on."""
    context: Any = None
    """The worker's ``GuardContext`` (``rayguard.train.get_context()``)."""
    hash_scheme: str | None = None
    """The scheme new checkpoints are hashed with (``None``: ``schemes.DEFAULT``)."""
    auth_key: Any = None
    """The checkpoint key set with ``auth.use`` (``None``: the environment's, if any)."""
    write_fault_hook: Callable[[str, int, int], None] | None = None
    """Called before each checkpoint write (tests: a full disk)."""
    phase_hook: Callable[[str, str], None] | None = None
    """Called at each point of the commit protocol (tests: a crash there)."""
    pending_data_skip: int = 0
    """Optimizer steps of data the next sampler restore leaves out (``health.divergence``)."""
    memory_keepers: dict[str, Any] = field(default_factory=dict)
    """The memory tier's keeper of each node, once asked."""
    memory_pending: list[Any] = field(default_factory=list)
    """The memory tier's registrations in flight (futures)."""
    memory_executor: Any = None
    """The memory tier's background executor, once started."""
    peer_waiting: tuple[Any, str] | None = None
    """The memory tier's peer-copy request that waits for the one running."""
    peer_thread: threading.Thread | None = None
    """The thread asking for peer copies, while it runs."""
    spare_recorded: int = -1
    """How many modules the process had when this worker last recorded them for the node's
    spares (-1: this worker does not record; only the lowest rank of a node does)."""


_DEFAULT = WorkerRuntime()
_BOUND: ContextVar[WorkerRuntime | None] = ContextVar("rayguard_runtime", default=None)
_lock = threading.Lock()
_default_held = [False]  # a worker of this process runs on the default runtime


def current() -> WorkerRuntime:
    """The runtime bound to the calling context, else the process's default one."""
    bound = _BOUND.get()
    return _DEFAULT if bound is None else bound


def default() -> WorkerRuntime:
    """The process's default runtime (what code sees where no runtime is bound)."""
    return _DEFAULT


@contextmanager
def bind(runtime: WorkerRuntime) -> Iterator[WorkerRuntime]:
    """Make ``runtime`` the one :func:`current` returns in this context for the block."""
    token = _BOUND.set(runtime)
    try:
        yield runtime
    finally:
        _BOUND.reset(token)


@contextmanager
def worker() -> Iterator[WorkerRuntime]:
    """The runtime of one worker's training function, bound for the block: the one already
    bound here (a harness's), else the process's default when no other worker of the process
    holds it (a Ray worker: code in threads rayguard did not start still sees it, as when the
    state was module-level), else a new one (a second worker in the same process)."""
    bound = _BOUND.get()
    if bound is not None:
        yield bound
        return
    with _lock:
        mine = not _default_held[0]
        _default_held[0] = True
    try:
        with bind(_DEFAULT if mine else WorkerRuntime()) as runtime:
            yield runtime
    finally:
        if mine:
            with _lock:
                _default_held[0] = False


def carry(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn``, run under the runtime current now (where it is made): for the target of a
    thread, or a task submitted to a pool, that rayguard starts in a worker."""
    runtime = current()

    @functools.wraps(fn)
    def carried(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with bind(runtime):
            return fn(*args, **kwargs)

    return carried


def pool(max_workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads see the runtime current now (its creator's) for their
    whole life: a pool that serves one worker, its tasks carried without a wrapper each."""
    return ThreadPoolExecutor(max_workers, thread_name_prefix=name, initializer=_BOUND.set,
                              initargs=(current(),))


__all__ = ["WorkerRuntime", "bind", "carry", "current", "default", "pool", "worker"]
