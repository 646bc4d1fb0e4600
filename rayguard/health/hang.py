"""A worker's side of the coordinated hang diagnosis (:mod:`rayguard.run.diagnosis`).

:class:`HangProbe` lives beside the watchdog. Its :meth:`~HangProbe.tick` runs in the
watchdog's thread on every wake-up (at least once a second): when a peer has opened this
attempt's diagnosis, the rank answers once with its collective state and its stacks, even
if its own bound has not fired. Polling a flag was chosen over a blocking call held open
in the coordinator per rank: one cheap non-blocking ``get`` per rank per second, no actor
thread held per rank (the coordinator's threads also serve the set-up and checkpoint
gathers). When the rank's own bound fires, :meth:`~HangProbe.on_own_stall` opens the
diagnosis (or joins the one a peer opened), answers, and waits for the one decision before
the stall responder ends the rank.

The collective state comes from torch's Flight Recorder where it records
(:mod:`rayguard._torch.flight_recorder`), else from rayguard's counting hook
(:mod:`rayguard._torch.counting`, installed at set-up only where the recorder is off).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rayguard")

def _skipped() -> tuple[str, ...]:
    """Where the frames a diagnosis looks past live: rayguard's and torch's own package
    folders (not any folder of that name: a user's code may live in one) and threading."""
    roots = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
    torch = sys.modules.get("torch")
    if getattr(torch, "__file__", None):
        roots.append(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)  # type: ignore[union-attr,arg-type]
    return (*roots, os.path.abspath(threading.__file__))


def top_frame(thread_id: int | None) -> str | None:
    """``file:line in function`` of the innermost frame of ``thread_id`` outside torch,
    rayguard and threading (the user's line), else its innermost frame."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    if frame is None:
        return None
    frames = traceback.extract_stack(frame)
    if not frames:
        return None
    skip = _skipped()
    chosen = next((f for f in reversed(frames)
                   if not os.path.abspath(f.filename).startswith(skip)), frames[-1])
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def collective_state() -> dict[str, dict[str, Any]]:
    """This process's collectives per process group: torch's recorder, else the hook's."""
    from rayguard._torch import counting, flight_recorder

    return flight_recorder.collective_state() or counting.collective_state()


def install_counting_hook() -> bool:
    """Set-up: rayguard's counting hook where torch's recorder does not record."""
    from rayguard._torch import counting, flight_recorder

    if flight_recorder.available():
        return False
    return counting.install()


class HangProbe:
    """One worker's answers to hang diagnoses. ``link``: a
    :class:`~rayguard.run.link.RunLink`; ``dump``: writes this rank's stacks, returns the
    file; ``wait_s``: the answer bound (``HealthConfig.diagnosis_wait_s``); ``thread_id``:
    the training thread (its top frame goes in the answer)."""

    def __init__(self, link: Any, *, dump: Callable[[], str | None], wait_s: float,
                 thread_id: int | None = None) -> None:
        self.link = link
        self.dump = dump
        self.wait_s = wait_s
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        coordinated = link.ctx.world_size > 1 and link.connected
        self._poll = link.diagnosis_poll() if coordinated else None
        self._lock = threading.Lock()
        self.answered = False
        self.stacks: str | None = None

    def publish_place(self) -> None:
        """Leave this rank's node and GPUs, named if it never answers (after CUDA pinning)."""
        if self._poll is None:
            return
        from rayguard.run.diagnosis import place_key

        ctx = self.link.ctx
        self.link.put(place_key(ctx.attempt, ctx.rank),
                      {"node": ctx.node_id, "gpu_ids": list(ctx.gpu_ids or ())})

    def tick(self) -> None:
        """The watchdog's wake-up: answer a diagnosis a peer opened (never raises)."""
        if self._poll is None or self.answered:
            return
        try:
            if self._poll.value():
                self.answer()
        except Exception as exc:  # a failed answer must not stop the watchdog
            logger.debug("rayguard: could not answer the hang diagnosis: %s", exc)

    def answer(self) -> None:
        """Dump the stacks and send this rank's answer (once)."""
        with self._lock:
            if self.answered:
                return
            self.answered = True
        ctx = self.link.ctx
        self.stacks = self.dump()
        try:
            groups = collective_state()
        except Exception as exc:  # an unreadable recorder: the stacks still go
            logger.debug("rayguard: could not read the collectives: %s", exc)
            groups = {}
        self.link.answer_diagnosis({
            "rank": ctx.rank, "node": ctx.node_id, "gpu_ids": list(ctx.gpu_ids or ()),
            "pid": os.getpid(), "groups": groups, "top_frame": top_frame(self.thread_id),
            "stacks": self.stacks})

    def on_own_stall(self) -> tuple[bool, dict[str, Any] | None]:
        """This rank's bound fired: ``(opened, diagnosis)``. ``opened``: this rank opened
        the diagnosis (it records ``stall_detected``), or acts alone (no peer to ask:
        world size 1, no coordinator); ``diagnosis``: the ``hang_diagnosed`` event."""
        if self._poll is None:
            return True, None
        opened = self.link.open_diagnosis(self.wait_s)
        if opened is None:
            return True, None
        self.answer()
        return opened, self.link.await_diagnosis(self.wait_s + 2.0)
