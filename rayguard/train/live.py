"""Live recovery inside a worker (``GuardConfig(recovery="live")``): a surviving rank keeps
its process when a peer fails, and rejoins the replacement.

The set-up wrapper (:class:`rayguard.train.setup.GuardedTrainFn`) calls
:func:`rejoin_attempt` when the training function raised. The decision is
:func:`rayguard.health.live.plan_rejoin`; on "rejoin" this rank leaves its process group
(:func:`leave_group`) and runs rayguard's set-up and the training function again in the
same process, at the attempt the coordinator opened: the process, its imports, its CUDA
context and its compiled code stay; the model, optimizer and data loader are the training
function's own and are built again, then restored by ``load_state()`` from the last
committed checkpoint (the memory tier when it holds it). Ray starts only the failed rank
again; it and the survivors form the process group anew in :func:`rendezvous` (rank 0 of
the new attempt hosts the store; the address goes through the coordinator).

Every wait is bounded: the notice (``HealthConfig(live_wait_s)``), the rendezvous (the same
bound). Past a bound the rank raises, Ray sees every rank fail and restarts the whole group
(the fallback, recorded as any restart).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, NoReturn

from rayguard import runtime
from rayguard._ray.spare import touch
from rayguard.constants import LIVE_PG_ENV_VAR
from rayguard.exceptions import PeersLostError
from rayguard.health.live import live_key, looks_like_peer_loss, opened_key, plan_rejoin
from rayguard.run.link import RunLink

logger = logging.getLogger("rayguard")

PG_KEY = "live:pg:{attempt}"
"""Coordinator key: ``[host, port]`` of the store rank 0 of a live attempt hosts."""


def await_notice(link: RunLink, attempt: int, wait_s: float) -> dict[str, Any] | None:
    """The coordinator's notice that ``attempt`` lost ranks (``None``: none in ``wait_s``)."""
    try:
        return link.wait_fact(live_key(attempt), wait_s)
    except Exception as exc:  # no coordinator: no live recovery
        logger.debug("rayguard: no live-recovery notice: %s", exc)
        return None


def rejoin_attempt(link: RunLink, exc: BaseException, wait_s: float) -> int | None:
    """The attempt this rank rejoins after ``exc`` ended its training function (``None``:
    raise ``exc`` as before)."""
    if not isinstance(exc, Exception):
        return None
    ctx = link.ctx
    if not looks_like_peer_loss(type(exc).__name__, str(exc)):
        return None
    leave_broken_group(exc)  # first: the loss reaches the peers blocked with this rank
    notice = await_notice(link, ctx.attempt, wait_s)
    decision = plan_rejoin(notice, rank=ctx.rank, attempt=ctx.attempt)
    if not decision.rejoin:
        logger.info("rayguard: rank %s raises: %s", ctx.rank, decision.reason)
        return None
    logger.debug("rayguard: rank %s keeps its process: rank(s) %s of attempt %s leave; "  # the
                 "rejoining in attempt %s (after %s: %s)", ctx.rank,  # restart/resize event
                 list(decision.replaced), ctx.attempt, decision.attempt,  # says it once
                 type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    return decision.attempt


def peer_lost(link: RunLink) -> Callable[[], str | None]:
    """Asked while this rank waits in a collective: what the run says this attempt lost
    (``None``: nothing yet), from the notice's long poll, never blocking."""
    poll = link.fact_poll(live_key(link.ctx.attempt))

    def lost() -> str | None:
        notice = poll.value()
        if notice is None:
            return None
        return (f"rank {link.ctx.rank}: attempt {link.ctx.attempt} lost rank(s) "
                f"{notice.get('ranks')} while this rank waited in a collective")

    return lost


class ResizeWatch:
    """Asked at every report of an elastic run under live recovery: once the run's notice
    says this attempt is resized in place (:mod:`rayguard.controller.resize`), the rank
    leaves it here, at a step boundary, by raising :class:`PeersLostError` (its peers still
    in a collective then see this rank's group close). Never blocks
    (:class:`rayguard.run.poll.FactPoll`)."""

    def __init__(self, link: RunLink) -> None:
        self._poll = link.fact_poll(live_key(link.ctx.attempt))
        self._ctx = link.ctx

    def __call__(self) -> None:
        from rayguard.elastic.in_place import is_resize

        notice = self._poll.value()
        if is_resize(notice):
            resize = notice["resize"]
            raise PeersLostError(
                f"rank {self._ctx.rank}: attempt {self._ctx.attempt} is resized in place from "
                f"{resize.get('old_world_size')} to {resize.get('world_size')} worker(s)")


def take_place(link: RunLink, attempt: int, wait_s: float) -> bool:
    """A rank that left its attempt for ``attempt`` (its reports abandoned, its group left):
    when that attempt resizes the group in place, say so to the controller, wait for the
    resized group (as long as the notice says, at least ``wait_s``:
    :func:`~rayguard.elastic.in_place.go_wait_s`) and take this rank's place in it: Ray's
    train context and the torch variables say the new rank, world size and local ranks,
    which set-up then reads. Returns whether it was a resize. Raises
    :class:`PeersLostError` when the group is not resized in time or this rank has no place
    in it."""
    from rayguard.controller.resize import go_key, left_key
    from rayguard.elastic.in_place import go_wait_s, is_resize, place_of

    ctx = link.ctx
    notice = link.get(live_key(ctx.attempt))
    if not is_resize(notice):
        return False
    link.mark(left_key(ctx.attempt, ctx.rank), True)
    bound = go_wait_s(notice, wait_s)
    go = link.wait_fact(go_key(attempt), bound)
    if go is None:
        raise PeersLostError(
            f"rank {ctx.rank}: the resize of attempt {ctx.attempt} was not in place within "
            f"{bound:g} s (HealthConfig(live_wait_s) for the kept workers to leave and the "
            "group to be placed, and Ray Train's worker-group start timeout for a grow's new "
            "workers); the worker group restarts")
    place = place_of(go, ctx.rank)
    if place is None:
        raise PeersLostError(f"rank {ctx.rank}: no place in the group resized for attempt "
                             f"{attempt}; this worker stops")
    apply_place(place)
    logger.debug("rayguard: rank %s keeps its process as rank %s of %s (attempt %s, resized in "
                 "place)", ctx.rank, place["world_rank"], place["world_size"], attempt)
    return True


def apply_place(place: dict[str, int]) -> None:
    """This process's place in a resized group: Ray Train's context (what
    ``ray.train.get_context()`` answers) and the torch variables Ray sets."""
    from rayguard._ray.context import set_distributed_place

    set_distributed_place(place)
    os.environ.update({"RANK": str(place["world_rank"]), "WORLD_SIZE": str(place["world_size"]),
                       "LOCAL_RANK": str(place["local_rank"]),
                       "LOCAL_WORLD_SIZE": str(place["local_world_size"]),
                       "NODE_RANK": str(place["node_rank"])})


class AttemptSuperseded(Exception):
    """A survivor's set-up for a live attempt that the run has already replaced by a newer
    one (a replacement failed before it joined): set up again for ``attempt``."""

    def __init__(self, attempt: int) -> None:
        super().__init__(attempt)
        self.attempt = attempt


def setup_lost(link: RunLink, wait_s: float | None) -> NoReturn:
    """A live attempt's set-up gather did not complete: a notice that this attempt lost ranks
    too (the replacement died in its own set-up) raises :class:`AttemptSuperseded` with the
    next one; otherwise :class:`PeersLostError` (the group then restarts)."""
    ctx = link.ctx
    decision = plan_rejoin(link.get(live_key(ctx.attempt)), rank=ctx.rank, attempt=ctx.attempt)
    if decision.rejoin and decision.attempt is not None:
        logger.warning("rayguard: rank %s: attempt %s lost rank(s) %s before they joined; "
                       "setting up again for attempt %s", ctx.rank, ctx.attempt,
                       list(decision.replaced), decision.attempt)
        raise AttemptSuperseded(decision.attempt)
    raise PeersLostError(
        f"rank {ctx.rank}: live recovery: not every peer set up within {wait_s:g} s "
        "(HealthConfig(live_wait_s); a survivor adds its replacements' start, as long as Ray "
        "Train gives a worker group to start); the worker group restarts")


class LiveWatch:
    """A survivor's watchdog tick (live recovery, NCCL): once the run says a peer of this
    attempt was lost, abort the process group from the watchdog's thread, so that a
    collective the training thread is blocked in raises (a gloo collective errors out by
    itself when the peer's connection closes, and gloo cannot be aborted). The notice is
    read without blocking, at most once a second (:class:`rayguard.run.poll.FactPoll`)."""

    def __init__(self, link: RunLink, abort: Any = None) -> None:
        self._poll = link.fact_poll(live_key(link.ctx.attempt))
        self._abort = abort if abort is not None else _abort_nccl
        self.aborted = False
        self._touched = float("-inf")

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._touched > 5.0:  # the run still holds this node's spare process
            self._touched = now
            touch()
        if self.aborted:
            return
        try:
            if self._poll.value() is not None:
                self.aborted = True
                self._abort()
        except Exception as exc:  # never stop the watchdog
            logger.debug("rayguard: live recovery could not abort the group: %s", exc)


def _abort_nccl() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()):
        leave_group()


LEAVE_SETTLE_S = 0.2
"""How long a survivor waits, the GIL released, between leaving its group and releasing
what held it (:func:`leave_broken_group`)."""


def leave_broken_group(exc: BaseException) -> str:
    """Leave the default group a peer's loss broke, and drop what the failed training
    function still holds of it (its frames, through ``exc``'s tracebacks: the DDP model, the
    optimizer), so that the group's connections close now. gloo cannot abort a collective:
    only the lost rank's neighbours see its connection close, and a rank blocked in a
    collective with a survivor that keeps its group open waits until its timeout. Closing
    here makes each survivor the next one's lost connection, so the loss reaches every rank
    in milliseconds (measured: 16 gloo ranks, the non-neighbours blocked otherwise)."""
    import gc
    import time
    import traceback

    how = leave_group()
    # Let the group's worker threads finish the collectives the leave ended before the
    # group itself goes: a gloo work destroyed in its thread needs the GIL, and the group's
    # destructor joins those threads holding it (seen once: a survivor frozen for good in
    # DDP's reducer release, its watchdog with it).
    time.sleep(LEAVE_SETTLE_S)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # frames still running are kept
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    gc.collect()
    return how


def leave_group() -> str:
    """Leave the default process group (:func:`rayguard._torch.groups.leave_default_group`)."""
    from rayguard._torch.groups import leave_default_group

    return leave_default_group()


def pg_settings() -> tuple[str, int]:
    """The process group's backend and timeout, as the live backend left them."""
    raw = os.environ.get(LIVE_PG_ENV_VAR, "gloo,1800")
    backend, _, timeout = raw.partition(",")
    return backend or "gloo", int(timeout or 1800)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def rendezvous(link: RunLink, wait_s: float) -> dict[str, float]:
    """Form the default process group of this attempt with its peers (the survivors and the
    replacement). Returns its phases: ``rendezvous_s`` in all, of which ``store_s`` (the
    address and every rank at the store) and ``pg_init_s`` (the group; on a GPU the
    communicator is made at once, so the NCCL set-up is in it); on a GPU also
    ``cuda_init_s`` before it (this process's CUDA context)."""
    import ray
    import torch.distributed as dist

    ctx = link.ctx
    phases = _cuda_init(ctx.device)
    started = time.monotonic()
    key = PG_KEY.format(attempt=ctx.attempt)
    if ctx.rank == 0:
        host = ray.util.get_node_ip_address()
        link.mark(key, [host, _free_port(host)])
    try:
        host, port = link.wait_for(key, timeout_s=wait_s)
    except Exception as exc:
        raise PeersLostError(
            f"rank {ctx.rank}: live recovery of attempt {ctx.attempt}: rank 0 never published "
            f"its process-group address within {wait_s} s (HealthConfig(live_wait_s)); the "
            "run falls back to a restart of the whole worker group") from exc
    backend, timeout_s = pg_settings()
    try:  # the store's own bound: a peer lost again before it connects ends the wait
        store = dist.TCPStore(str(host), int(port), ctx.world_size, is_master=ctx.rank == 0,
                              timeout=datetime.timedelta(seconds=wait_s),
                              wait_for_workers=True)
    except Exception as exc:
        raise PeersLostError(
            f"rank {ctx.rank}: live recovery of attempt {ctx.attempt}: the process group's "
            f"store at {host}:{port} did not gather all {ctx.world_size} ranks within "
            f"{wait_s} s (HealthConfig(live_wait_s)): {exc}; the run falls back to a "
            "restart of the whole worker group") from exc
    stored = time.monotonic()
    cuda = getattr(ctx.device, "type", "cpu") == "cuda"
    dist.init_process_group(backend=backend, store=store, rank=ctx.rank,
                            world_size=ctx.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            **({"device_id": ctx.device} if cuda else {}))
    # as Ray's own set-up leaves them: frameworks read the group's address from the
    # environment (Accelerate refuses a multi-worker start without MASTER_ADDR)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = str(host), str(port)
    done = time.monotonic()
    return {**phases, "store_s": stored - started, "pg_init_s": done - stored,
            "rendezvous_s": done - started}


def _cuda_init(device: Any) -> dict[str, float]:
    """This process's CUDA context, made and timed (``{}`` off a GPU)."""
    if getattr(device, "type", "cpu") != "cuda":
        return {}
    import torch

    started = time.monotonic()
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    return {"cuda_init_s": time.monotonic() - started}


def _process_started_at() -> float | None:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # psutil comes with Ray; never fail set-up for a figure
        return None


def record_rejoined(link: RunLink, *, replacement: bool, setup_start_time: float,
                    formed_at: float, phases: dict[str, float]) -> None:
    """This rank's ``rejoined`` event: its phases from the recovery's opening (the notice's
    time) to its process group. A replacement: ``process_start_s`` (the notice to its process
    existing; 0 and ``spare=True`` when Ray gave it the node's warm spare,
    :mod:`rayguard._ray.spare`), ``imports_s`` (from then to rayguard's set-up: Ray's actor,
    imports, the train context), ``setup_s`` (set-up to the rendezvous) and :func:`rendezvous`'s phases;
    a survivor: ``wait_s`` (the notice to its set-up again), ``setup_s``, the same."""
    ctx = link.ctx
    try:
        notice = link.get(opened_key(ctx.attempt)) or {}
    except Exception:
        notice = {}
    opened = notice.get("at")
    phases = {"setup_s": formed_at - setup_start_time, **phases}
    started = _process_started_at() if replacement else None
    spare = None
    if replacement and started is not None:
        spare = opened is not None and started < opened  # a warm spare: it was waiting
        begun = max(started, opened) if opened is not None else started
        phases["imports_s"] = setup_start_time - begun
        if opened is not None:
            phases["process_start_s"] = max(0.0, started - opened)
    elif opened is not None:
        phases["wait_s"] = setup_start_time - opened
    who = "replacement" if replacement else "survivor, same process"
    link.record("rejoined", f"rank {ctx.rank} ({who}) joined attempt {ctx.attempt}'s process "
                "group" + (" (in a warm spare process)" if spare else ""),
                replacement=replacement, phases=phases, pid=os.getpid(),
                ranks=notice.get("ranks"), **({} if spare is None else {"spare": spare}))


__all__ = ["AttemptSuperseded", "LiveWatch", "PG_KEY", "ResizeWatch", "apply_place",
           "take_place", "setup_lost", "await_notice", "leave_broken_group", "leave_group", "peer_lost", "pg_settings", "rejoin_attempt",
           "record_rejoined", "rendezvous"]


def keep_spare(ctx: Any, infos: list[dict[str, Any]], after_s: float = 0.0) -> None:
    """After set-up (every rank of the attempt has claimed its process): the lowest rank of
    each node records the modules it has imported and makes sure, ``after_s`` on, that the
    node has a warm spare process (:mod:`rayguard._ray.spare`), in the background."""
    import threading

    from rayguard._ray.spare import SPARE_DIR_ENV, ensure_spare, record_modules

    if not os.environ.get(SPARE_DIR_ENV):
        return
    mine = [i["rank"] for i in infos if i and i.get("node_id") == ctx.node_id]
    if mine and ctx.rank == min(mine):
        record_modules()  # what the spare imports before it waits
        threading.Thread(target=runtime.carry(ensure_spare), args=(after_s,),
                         name="rayguard-spare", daemon=True).start()


def release_spare(ctx: Any) -> None:
    """The run's function returned on this rank: its node's spares are no longer needed."""
    from rayguard._ray.spare import SPARE_DIR_ENV, release_spares

    if os.environ.get(SPARE_DIR_ENV):
        release_spares()
