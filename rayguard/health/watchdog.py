"""The progress watchdog that runs in each worker.

Progress is every ``rayguard.train.report`` (a completed step) and every
``rayguard.train.heartbeat()``. A background thread checks, about ten times per timeout,
whether the rank has been idle for longer than the stall timeout in force (explicit, or
adaptive from the slowest step seen) and then calls ``on_stall`` once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rayguard.health.config import HealthConfig
from rayguard.health.decisions import Decision, check_stall


class Watchdog:
    def __init__(self, health: HealthConfig, on_stall: Callable[[Decision], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.health = health
        self.on_stall = on_stall
        self.clock = clock
        self.last_progress = clock()
        self.last_step_end: float | None = None
        self.slowest_step_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    @property
    def timeout_s(self) -> float:
        return self.health.stall_timeout_for(self.slowest_step_s)

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
        return check_stall(self.clock(), self.last_progress, self.timeout_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rayguard-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, max(0.05, self.timeout_s / 10))):
            decision = self.check()
            if not decision.ok and not self.fired:
                self.fired = True
                self.on_stall(decision)
                return
