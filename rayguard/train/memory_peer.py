"""The memory tier's second copy, taken from a worker (:mod:`rayguard.train.memory_tier`).

Once a rank's own copy of a shard is registered, the keeper of its peer node
(:mod:`rayguard.checkpoint.peer`, chosen by the coordinator) takes a second copy: it receives
the bytes from this node's object store and ``ray.put``s them into its own, owned by itself,
so that the copy outlives this node. One thread per process does it, off the training loop
and off the own copy's registration (which the next save waits for): at most one peer copy
runs and one waits; a newer checkpoint's copy replaces the one still waiting (that
checkpoint is superseded), so a loop that saves faster than copies travel never blocks on
them, and no more than two own copies are held alive for them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger("rayguard")

_lock = threading.Lock()
_waiting: tuple[Any, str, list[Any], float] | None = None
_thread: threading.Thread | None = None


def queue_peer_copy(link: Any, final: str, refs: list[Any], timeout_s: float) -> None:
    """Have the peer keeper copy ``refs`` (this rank's own copy of ``final``), in the
    background; replaces a copy still waiting."""
    global _waiting, _thread
    with _lock:
        _waiting = (link, final, refs, timeout_s)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="rg-memory-peer", daemon=True)
            _thread.start()


def _run() -> None:
    global _waiting, _thread
    while True:
        with _lock:
            job, _waiting = _waiting, None
            if job is None:
                _thread = None
                return
        copy_to_peer(*job)


def copy_to_peer(link: Any, final: str, refs: list[Any], timeout_s: float) -> bool:
    """Copy ``refs`` to the keeper of this rank's peer node and register it; whether a peer
    copy was registered (never raises: without one, this node's loss reads the disk)."""
    try:
        peer = link.memory_peer(final)
        if peer is None:
            return False
        node, keeper = peer
        import ray

        peer_refs = ray.get(keeper.hold.remote(refs[0]), timeout=timeout_s)
        return bool(link.memory_offer_peer(final, node, peer_refs))
    except Exception as exc:
        logger.warning("rayguard: rank %d: no peer memory copy of %s (%s); a loss of this "
                       "node reads the disk", link.ctx.rank, final, exc)
        return False


def wait_idle(timeout_s: float = 120.0) -> None:
    """Wait until no peer copy runs or waits (tests, benchmarks, end of a worker)."""
    with _lock:
        thread = _thread
    if thread is not None:
        thread.join(timeout_s)
