"""The memory tier's second copy, asked for by a worker (:mod:`rayguard.train.memory_tier`).

Once a rank's own copy of a shard is registered, the rank asks the coordinator to have the
keeper of its peer node (:mod:`rayguard.checkpoint.peer`) take a second copy
(:meth:`~rayguard.run.memory_host.MemoryHost.memory_copy_to_peer`): the bytes travel from
this node's object store to the peer's, and the references never pass through this worker,
so a worker killed meanwhile takes no copy with it. One thread per worker (its request and
its thread are held by the worker's :mod:`rayguard.runtime`) asks, off the training loop and
off the own copy's registration (which the next save waits for): at most
one request runs and one waits; a newer checkpoint's request replaces the one still waiting
(that checkpoint is superseded), so a loop that saves faster than copies travel never blocks
on them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rayguard import runtime

logger = logging.getLogger("rayguard")

_lock = threading.Lock()  # guards every runtime's peer_waiting and peer_thread


def queue_peer_copy(link: Any, final: str) -> None:
    """Ask for the peer copy of this rank's snapshot of ``final``, in the background;
    replaces a request still waiting."""
    rt = runtime.current()
    with _lock:
        rt.peer_waiting = (link, final)
        if rt.peer_thread is None:
            rt.peer_thread = threading.Thread(target=runtime.carry(_run),
                                              name="rg-memory-peer", daemon=True)
            rt.peer_thread.start()


def _run() -> None:
    rt = runtime.current()  # the starter's: the thread runs carried
    while True:
        with _lock:
            job, rt.peer_waiting = rt.peer_waiting, None
            if job is None:
                rt.peer_thread = None
                return
        copy_to_peer(*job)


def copy_to_peer(link: Any, final: str) -> bool:
    """Ask for the peer copy of ``final`` and wait for it; whether one is held now (never
    raises: without one, this node's loss reads the disk)."""
    try:
        return link.memory_copy_to_peer(final) is not None
    except Exception as exc:
        logger.warning("rayguard: rank %d: no peer memory copy of %s (%s); a loss of this "
                       "node reads the disk", link.ctx.rank, final, exc)
        return False


def wait_idle(timeout_s: float = 240.0) -> None:
    """Wait until no peer copy runs or waits (tests, benchmarks, end of a worker)."""
    with _lock:
        thread = runtime.current().peer_thread
    if thread is not None:
        thread.join(timeout_s)
