"""The workers and nodes a :class:`~rayguard.testing.controller.ControllerHarness` scripts.

A :class:`FakeWorker` is one rank's process: the test's ``loop(worker)`` runs once per
controller poll (one training step's worth), and the worker side of rayguard runs as it runs
in a real worker: its :class:`~rayguard.run.link.RunLink` to the run coordinator, its
:class:`~rayguard.health.watchdog.Watchdog` (start-up and stall bounds) answered by the real
:class:`~rayguard.health.stall.StallResponder`, its :class:`~rayguard.observe.steps.StepTimer`
(the step summaries the straggler rule reads), and ``record_failure`` when the loop raises.
Time is the script's clock, moved by ``step_s`` per poll (or by ``advance``): a 30-minute
start-up bound takes a few milliseconds. Ranks are not coupled: where a real rank would be
blocked in a collective with a peer (DDP's all-reduce, a survivor waiting for its
replacement), the loop says so by not reporting.

:class:`Cluster` is the nodes (id -> CPUs, alive or not) the placement, ``ray.nodes()`` and
Ray's autoscaling reservations read.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from rayguard._ray.harness import dead_worker_error, startup_timeout, user_error
from rayguard.events import make_event
from rayguard.health.config import HealthConfig
from rayguard.health.stall import StallResponder
from rayguard.health.watchdog import Watchdog
from rayguard.observe.steps import StepTimer
from rayguard.placement.exclude import NODE_ID_LABEL
from rayguard.run.link import RunLink

Loop = Callable[["FakeWorker"], None]


class Clock:
    """Seconds, moved by hand (monotonic and wall clock alike)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def node_id(name: str) -> str:
    """The Ray node id (56 lowercase hex digits, as the quarantine file requires) a test's
    node ``name`` stands for: its bytes in hex, padded with zeros."""
    text = name.encode().hex()
    if len(text) > 56:
        raise ValueError(f"node name {name!r}: at most 28 bytes")
    return text.ljust(56, "0")


@dataclass
class Node:
    name: str
    cpus: float
    alive: bool = True

    @property
    def node_id(self) -> str:
        return node_id(self.name)


@dataclass(frozen=True)
class Slot:
    """Where a worker is placed (what Ray's worker metadata says)."""

    node_id: str
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    gpu_ids: tuple[str, ...] = ()
    name: str = ""
    """The node's name in the test."""


class Cluster:
    def __init__(self, nodes: dict[str, float]) -> None:
        self.nodes = {n: Node(n, float(c)) for n, c in nodes.items()}
        """By name (a test's word for a node; Ray and the events see :func:`node_id`)."""

    def ray_nodes(self) -> list[dict[str, Any]]:
        """``ray.nodes()`` as Ray answers it."""
        return [{"NodeID": n.node_id, "Alive": n.alive, "Resources": {"CPU": n.cpus}}
                for n in self.nodes.values()]

    def place(self, num_workers: int, selectors: list[dict[str, str]] | None,
              cpus_per_worker: float) -> list[Slot]:
        """``num_workers`` slots on alive nodes, in node order, honouring each worker's node
        selector; Ray's start-up timeout error when they do not fit."""
        room = {n.name: int(n.cpus // cpus_per_worker) for n in self.nodes.values() if n.alive}
        slots = []
        for worker in range(num_workers):
            selector = (selectors or [{}] * num_workers)[worker] or {}
            node = next((n for n, left in room.items()
                         if left > 0 and admits(selector.get(NODE_ID_LABEL), node_id(n))), None)
            if node is None:
                raise startup_timeout(num_workers)
            room[node] -= 1
            slots.append(Slot(node_id(node), {"CPU": cpus_per_worker}, name=node))
        return slots


def admits(selector: str | None, node: str) -> bool:
    """Whether a ``ray.io/node-id`` selector value admits ``node``."""
    if not selector:
        return True
    negated = selector.startswith("!")
    text = selector[1:] if negated else selector
    if text.startswith("in("):
        values = {v.strip() for v in text[3:-1].split(",") if v.strip()}
    else:
        values = {text}
    return (node in values) != negated


class FakeWorker:
    """One rank's process. The loop calls :meth:`report`, :meth:`heartbeat`, :meth:`hang`,
    :meth:`finish`, :meth:`die`, :meth:`commit`, or raises."""

    _pids = itertools.count(1000)

    def __init__(self, slot: Slot, rank: int, world_size: int, attempt: int, *, coordinator: Any,
                 health: HealthConfig, clock: Clock, run_dir: str, resumed_step: int) -> None:
        self.slot = slot
        self.node = slot.node_id
        self.node_name = slot.name
        """The node's name in the test (:attr:`node` is its Ray id)."""
        self.pid = next(self._pids)
        """A new process has a new pid (a survivor of a live recovery keeps its own)."""
        self.ctx = SimpleNamespace(rank=rank, world_size=world_size, attempt=attempt,
                                   node_id=slot.node_id, run_dir=run_dir, gpu_ids=[])
        self.coordinator = coordinator
        self.clock = clock
        self.step = resumed_step
        """The last step this rank completed (-1: none)."""
        self.ticks = 0
        """Polls this process has run its loop for."""
        self.running, self.hung = True, False
        self.committed: int | None = None
        """The step of the last checkpoint this rank committed in this process."""
        self.error: BaseException | None = None
        self.link = RunLink(self.ctx, coordinator)
        self.watchdog = Watchdog(health, StallResponder(
            self.link, last_step=lambda: self.step, local_run_dir=True,
            kill=lambda: self.die("killed by rayguard's watchdog")), clock=clock)
        self.timer = StepTimer(interval_s=health.step_summary_interval_s, clock=clock, wall=clock)

    @property
    def rank(self) -> int:
        return int(self.ctx.rank)

    @property
    def attempt(self) -> int:
        return int(self.ctx.attempt)

    @property
    def world_size(self) -> int:
        return int(self.ctx.world_size)

    # -- what the loop does ---------------------------------------------------------------
    def report(self, **metrics: Any) -> None:
        """One step completed and reported (the watchdog, the step timer, rank 0's progress)."""
        self.step += 1
        self.watchdog.step_completed()
        summary = self.timer.on_report(self.step, metrics, 0.0)
        if summary is not None:
            summary.update(rank=self.rank, node=self.node, attempt=self.attempt, gpu_ids=[],
                           time=self.clock())
            self.link.send_summary(summary)
        if self.rank == 0:
            self.link.send_progress({"step": self.step, "metrics": metrics, "time": self.clock()})

    def heartbeat(self) -> None:
        self.watchdog.heartbeat()

    def commit(self, path: str | None = None) -> None:
        """A checkpoint of the current step committed (durable progress)."""
        self.coordinator.record(make_event(
            "checkpoint_committed", f"checkpoint of step {self.step}", rank=self.rank,
            step=self.step, attempt=self.attempt, path=path or f"checkpoint_{self.step:06d}"))
        self.committed = self.step

    def hang(self) -> None:
        """From now on the loop does nothing (a stuck collective, a dead-locked loader)."""
        self.hung = True

    def finish(self) -> None:
        self.running = False

    def die(self, why: str = "killed") -> None:
        """The process is gone (SIGKILL, OOM, its node lost)."""
        if self.running:
            self.running = False
            self.error = dead_worker_error(why)

    # -- what the script does with it ---------------------------------------------------------
    def tick(self, loop: Loop) -> None:
        """One poll's worth: the loop (unless hung), then the watchdog's check."""
        if not self.running:
            return
        self.ticks += 1
        if not self.hung:
            try:
                loop(self)
            except Exception as exc:  # the session records how the attempt ended, re-raises
                self.link.record_failure(exc, self.step)
                self.running = False
                self.error = user_error(exc, "".join(traceback.format_exception(exc)))
                return
        if self.running and not self.watchdog.fired:
            decision = self.watchdog.check()
            if not decision.ok:
                self.watchdog.fired = True
                self.watchdog.on_stall(decision)

    def status(self) -> tuple[bool, BaseException | None]:
        """``(running, error)`` as Ray's poll reports it."""
        return self.running, self.error
