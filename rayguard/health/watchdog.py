"""The progress watchdog that runs in each worker.

Progress is every ``rayguard.train.report`` (a completed step) and every
``rayguard.train.heartbeat()``. Two bounds: until the first completed step of an attempt
(set-up, ``load_state()``, CUDA/NCCL init, compilation) the start-up timeout applies; from
then on the stall timeout (explicit, or adaptive from the slowest step seen). A background
thread checks about ten times per bound (at least once a second) and calls ``on_stall``
once with a decision that names the bound that fired; ``on_tick`` runs on every wake-up
(a peer's hang diagnosis is answered there, :mod:`rayguard.health.hang`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rayguard import runtime
from rayguard.health.checks import check_stall
from rayguard.health.config import HealthConfig
from rayguard.health.decisions import Decision, stall_decision


class Watchdog:
    def __init__(self, health: HealthConfig, on_stall: Callable[[Decision], None],
                 clock: Callable[[], float] = time.monotonic,
                 on_tick: Callable[[], None] | None = None) -> None:
        self.health = health
        self.on_stall = on_stall
        self.on_tick = on_tick
        """Called on every wake-up of the thread, before the check (the hang probe answers a
        peer's diagnosis there: :class:`rayguard.health.hang.HangProbe`)."""
        self.clock = clock
        self.last_progress = clock()
        self.last_step_end: float | None = None
        self.slowest_step_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    @property
    def bound(self) -> tuple[str, float]:
        """``(name, seconds)`` of the bound in force (``startup`` or ``stall``)."""
        return self.health.progress_bound(self.slowest_step_s,
                                          started=self.last_step_end is not None)

    @property
    def timeout_s(self) -> float:
        return self.bound[1]

    def step_completed(self) -> None:
        now = self.clock()
        if self.last_step_end is not None:
            duration = now - self.last_step_end
            if self.slowest_step_s is None or duration > self.slowest_step_s:
                self.slowest_step_s = duration
        self.last_step_end = now
        self.last_progress = now

    def heartbeat(self) -> None:
        self.last_progress = self.clock()

    def check(self) -> Decision:
        name, timeout_s = self.bound
        return stall_decision(check_stall("", self.last_progress, self.clock(), timeout_s,
                                          bound=name))

    def start(self) -> None:
        self._thread = threading.Thread(target=runtime.carry(self._run), name="rayguard-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, max(0.05, self.timeout_s / 10))):
            if self.on_tick is not None:
                self.on_tick()
            decision = self.check()
            if not decision.ok and not self.fired:
                self.fired = True
                self.on_stall(decision)
                return
