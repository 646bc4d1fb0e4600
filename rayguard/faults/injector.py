"""Fault injection: kill, hang, raise or poison a metric at a given rank and step.

The spec (``GuardConfig(faults=...)`` or the ``RAYGUARD_FAULTS`` environment variable, e.g.
``kill:rank=1,step=5;nan:rank=0,step=4``) and its fields are documented, and parsed, in
:mod:`rayguard.faults.spec` (pure, so that the config can validate a spec without importing
this module).

A fault fires once per run: the run's coordinator records it, so a restarted worker group
replays the same steps without firing it again.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from rayguard.exceptions import InjectedFault
from rayguard.faults.spec import KINDS, POINTS, Fault, injected_mark, parse_faults
from rayguard.run.facts import cause_key

__all__ = ["KINDS", "POINTS", "Fault", "FaultInjector", "announcer", "parse_faults"]


def _hang(seconds: float | None) -> None:
    event = threading.Event()  # never set: a real block, not a busy loop
    event.wait(seconds)


class FaultInjector:
    """Fires the faults that match a rank/step/point, each once per run.

    ``claim`` returns True the first time a fault key is claimed in this run (the run's
    coordinator answers it across processes and restarts; without one, a local set).
    """

    def __init__(self, faults: tuple[Fault, ...], *, rank: int, attempt: int,
                 claim: Callable[[str], bool] | None = None,
                 on_fire: Callable[[Fault, int | None], None] | None = None) -> None:
        self.faults = faults
        self.on_fire = on_fire
        """Called just before a fault fires, with the fault and the step it fires at (None
        at a load): the session records it in the event log."""
        self.rank = rank
        self.attempt = attempt
        self._local_claims: set[str] = set()
        self._claim = claim or self._claim_locally

    def _claim_locally(self, key: str) -> bool:
        if key in self._local_claims:
            return False
        self._local_claims.add(key)
        return True

    def _due(self, at: str, step: int | None) -> list[Fault]:
        return [f for f in self.faults
                if f.matches(rank=self.rank, step=step, at=at, attempt=self.attempt)
                and self._claim(f"{f.key}@rank{self.rank}")]

    def on_report(self, step: int, metrics: dict) -> dict:
        """Apply faults due at this report; returns the (possibly poisoned) metrics."""
        for fault in self._due("report", step):
            metrics = self._fire(fault, step, metrics)
        return metrics

    def on_load(self) -> None:
        for fault in self._due("load", None):
            self._fire(fault, None, {})

    def on_setup(self) -> None:
        """rayguard's worker set-up, before this rank has told the others it is there."""
        for fault in self._due("setup", None):
            self._fire(fault, None, {})

    def _fire(self, fault: Fault, step: int | None, metrics: dict) -> dict:
        if self.on_fire is not None:
            self.on_fire(fault, step)
        if fault.kind == "nan":
            return {**metrics, fault.metric: float("nan")}
        if fault.kind == "raise":
            raise InjectedFault(f"injected fault {fault.key} on rank {self.rank}")
        if fault.kind == "hang":
            _hang(fault.seconds)
            return metrics
        os.kill(os.getpid(), signal.SIGKILL)  # kind == "kill": a real process death
        return metrics  # pragma: no cover


def announcer(link: Any, last_step: Callable[[], int]) -> Callable[[Fault, int | None], None]:
    """The ``on_fire`` of a worker: say that a fault is about to fire (a kill leaves no
    other trace) over ``link`` (a :class:`~rayguard.run.link.RunLink`): the cause for the
    controller, and ``fault_injected`` at the fault's step (``last_step()`` at a load)."""
    def on_fire(fault: Fault, step: int | None = None) -> None:
        ctx = link.ctx
        link.mark(cause_key(ctx.attempt, ctx.rank), injected_mark(fault.kind, fault.source))
        link.record("fault_injected", f"injected {fault.kind} ({fault.key}; from "
                    f"{fault.source})", step=last_step() if step is None else step,
                    wait=True, fault=fault.kind, source=fault.source)

    return on_fire
