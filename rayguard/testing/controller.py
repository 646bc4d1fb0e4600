"""ControllerHarness: Ray Train's real controller, rayguard's real controller side, scripted
workers, in this process and in milliseconds.

What is real: Ray Train V2's ``TrainController`` and its state machine (stepped here as its
actor's ``run()`` steps it), the failure policy, callbacks and scaling policy exactly as
:class:`~rayguard.RobustTrainer` wires them (its ``controller_callbacks`` and
``controller_policies``), the run coordinator (:class:`~rayguard.run.coordinator.RunCoordinator`
on its own event loop, :class:`~rayguard.testing.coordinator.InProcessCoordinator`) writing the
real event log and quarantine file in the run directory, and each worker's rayguard side
(:mod:`rayguard.testing.fake_workers`). What is scripted: the worker processes (a ``loop``
called once per poll), the nodes, and time (a clock moved by ``step_s`` per poll).

>>> def bug(w):
...     if w.step < 2:
...         w.report(loss=1.0)
...     else:
...         raise ValueError("my bug")
>>> with ControllerHarness(tmp_path, bug, num_workers=2) as h:
...     h.run()
...     assert h.state == "ERRORED" and h.kinds().count("crash_loop") == 1

Ray's private classes are reached only through :mod:`rayguard._ray.harness`, which raises a
:class:`~rayguard.exceptions.RayVersionError` naming what moved.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig

from rayguard._ray.harness import (
    build_controller,
    in_process_ray,
    no_reservation_cache,
    startup_timeout,
    state_name,
    step,
)
from rayguard._ray.train import create_scaling_policy
from rayguard.config import GuardConfig
from rayguard.controller import fence
from rayguard.controller.fence import FenceView
from rayguard.events import events_path
from rayguard.events import read as read_events
from rayguard.run.coordinator import RunCoordinator
from rayguard.testing.coordinator import InProcessCoordinator
from rayguard.testing.fake_workers import Clock, Cluster, FakeWorker, Loop, Node, Slot, node_id
from rayguard.trainer import RobustTrainer

__all__ = ["ControllerHarness", "FakeWorker", "Group", "HarnessError", "steady"]

TERMINAL = ("FINISHED", "ERRORED", "ABORTED")


class HarnessError(AssertionError):
    """The scripted run did not get where the test said it would."""


def steady(steps: int, *, commit_every: int | None = None) -> Loop:
    """A loop that reports ``steps`` steps (committing every ``commit_every``) and returns."""
    def loop(w: FakeWorker) -> None:
        if w.step + 1 >= steps:
            w.finish()
            return
        w.report(loss=1.0 / (w.step + 2))
        if commit_every and (w.step + 1) % commit_every == 0 and w.rank == 0:
            w.commit()
    return loop


@dataclass(frozen=True)
class Group:
    """One worker group the controller started (or a replacement it made)."""

    attempt: int
    nodes: tuple[str, ...]
    """Each rank's node, by name."""
    pids: tuple[int, ...]
    replaced: tuple[int, ...] = ()
    """The ranks a replica-group replacement started (the others kept their processes)."""


class ControllerHarness:
    """A run of ``loop`` under Ray's controller with rayguard's controller side.

    ``num_workers``: an int, or ``(min, max)`` for an elastic run. ``nodes``: node id ->
    CPUs (default: one node holding every worker). ``step_s``: the clock's move per poll.
    ``torch_config``: as ``RobustTrainer`` takes it (Ray's ``TorchftConfig``: replica groups)."""

    def __init__(self, tmp_path: Any, loop: Loop, *, num_workers: int | tuple[int, int] = 2,
                 guard: GuardConfig | None = None, failure_config: FailureConfig | None = None,
                 nodes: dict[str, float] | None = None, cpus_per_worker: float = 1.0,
                 step_s: float = 1.0, name: str = "run", torch_config: Any = None,
                 **scaling: Any) -> None:
        most = num_workers[1] if isinstance(num_workers, tuple) else num_workers
        self.cluster = Cluster(nodes or {"node-0": most * cpus_per_worker})
        self.clock = Clock(time.time())
        self.loop, self.step_s, self.cpus_per_worker = loop, step_s, cpus_per_worker
        self.workers: list[FakeWorker] = []
        self.groups: list[Group] = []
        self.states: list[str] = []
        self._committed: int | None = None
        self._stack = ExitStack()
        self._stack.enter_context(in_process_ray(self.cluster.ray_nodes))
        self._stack.callback(setattr, fence, "WAIT_POLL_S", fence.WAIT_POLL_S)
        fence.WAIT_POLL_S = 0.0  # a waiting fixed-size run asks again at the next step
        try:
            self.trainer = RobustTrainer(
                loop, guard_config=guard or GuardConfig(numa="off", preflight=False),
                scaling_config=ScalingConfig(num_workers=num_workers,
                                             resources_per_worker={"CPU": cpus_per_worker},
                                             **scaling),
                run_config=RunConfig(storage_path=str(tmp_path), name=name,
                                     failure_config=failure_config or FailureConfig()),
                **({"torch_config": torch_config} if torch_config is not None else {}))
            self.run_dir = self.trainer.run_dir
            os.makedirs(self.run_dir, exist_ok=True)
            self.coordinator = InProcessCoordinator(RunCoordinator(
                str(events_path(self.run_dir)), **self.trainer._coordinator_args()))
            self._stack.callback(self.coordinator.stop)
            self.controller = self._build()
        except BaseException:
            self._stack.close()
            raise
        self._loop = asyncio.new_event_loop()
        self._stack.callback(self._loop.close)

    def _build(self) -> Any:
        """The controller as ``RobustTrainer.fit()`` builds it (no Ray default callbacks:
        they start actors)."""
        self.trainer._coordinator = self.coordinator
        callbacks = self.trainer.controller_callbacks([])
        policies = self.trainer.controller_policies()
        scaling = policies.get("scaling_policy") or create_scaling_policy(
            self.trainer.scaling_config)
        no_reservation_cache(scaling)
        for holder in (scaling, *callbacks):  # its 1 s cache is real time, not the clock's
            for view in (getattr(holder, "fence", None), getattr(holder, "excluded", None)):
                if isinstance(view, FenceView):
                    view.ttl_s = 0.0
        self.scaling_policy, self.failure_policy = scaling, policies["failure_policy"]
        self.callbacks = callbacks
        return build_controller(_Script(self), self.trainer.train_run_context, scaling,
                                self.failure_policy, callbacks)

    # -- driving ---------------------------------------------------------------------------
    def __enter__(self) -> ControllerHarness:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    def step(self) -> str:
        """One iteration of the controller's loop; returns the state it leaves."""
        if self.state in TERMINAL:
            raise HarnessError(f"the run already ended ({self.state})")
        step(self.controller, self._loop)
        self.states.append(self.state)
        return self.states[-1]

    def run(self, until: Callable[[ControllerHarness], bool] | None = None,
            max_steps: int = 500) -> ControllerHarness:
        """Step until the run ends (or ``until(self)``); a run still going after
        ``max_steps`` is a :class:`HarnessError` naming its last states."""
        for _ in range(max_steps):
            if self.state in TERMINAL or (until is not None and until(self)):
                return self
            self.step()
        raise HarnessError(f"still {self.state} after {max_steps} steps; last states: "
                           f"{self.states[-8:]}")

    def run_until_running(self, max_steps: int = 50) -> ControllerHarness:
        """Step until a worker group runs (and has been polled once)."""
        return self.run(lambda h: h.states[-1:] == ["RUNNING"] and bool(h.workers)
                        and h.states[-2:-1] == ["RUNNING"], max_steps)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- the cluster -----------------------------------------------------------------------
    def lose_node(self, name: str) -> None:
        """The node goes away with every worker on it."""
        self.cluster.nodes[name].alive = False
        for w in self.workers:
            if w.node_name == name:
                w.die(f"node {name} lost")

    def add_node(self, name: str, cpus: float) -> None:
        self.cluster.nodes[name] = Node(name, float(cpus))

    @staticmethod
    def node(name: str) -> str:
        """The Ray node id of the node called ``name`` (what events and workers carry)."""
        return node_id(name)

    # -- what happened ---------------------------------------------------------------------
    @property
    def state(self) -> str:
        return state_name(self.controller)

    @property
    def error(self) -> BaseException | None:
        """The error the run ended with (``fit()`` raises it), once it ended."""
        return self.controller.get_result().error

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The run's event log as written (``kind``: only those)."""
        path = events_path(self.run_dir)
        events = read_events(self.run_dir) if os.path.exists(path) else []
        return [e for e in events if kind is None or e["kind"] == kind]

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events()]

    def worker(self, rank: int) -> FakeWorker:
        return self.workers[rank]


class _Script:
    """What :class:`~rayguard._ray.harness.ScriptedWorkerGroup` asks of the harness."""

    def __init__(self, harness: ControllerHarness) -> None:
        self.h = harness

    def place(self, num_workers: int, selectors: list[dict[str, str]] | None) -> list[Slot]:
        return self.h.cluster.place(num_workers, selectors, self.h.cpus_per_worker)

    def _worker(self, slot: Slot, rank: int, world: int, attempt: int) -> FakeWorker:
        h = self.h
        resumed = h._committed if h._committed is not None else -1
        return FakeWorker(slot, rank, world, attempt, coordinator=h.coordinator,
                          health=h.trainer.guard_config.health, clock=h.clock,
                          run_dir=h.run_dir, resumed_step=resumed)

    def started(self, slots: list[Slot]) -> None:
        h = self.h
        attempt = int(h.coordinator.attempt())
        h.workers = [self._worker(s, r, len(slots), attempt) for r, s in enumerate(slots)]
        h.groups.append(Group(attempt, tuple(s.name for s in slots),
                              tuple(w.pid for w in h.workers)))
        h.workers[0].link.record("attempt_started", f"attempt {attempt} started with "
                                 f"{len(slots)} worker(s)", world_size=len(slots))

    def poll(self) -> dict[int, tuple[bool, BaseException | None]]:
        h = self.h
        h.clock.advance(h.step_s)
        for w in h.workers:
            w.tick(h.loop)
            if w.committed is not None:
                h._committed = max(w.committed, h._committed or -1)
        return {w.rank: w.status() for w in h.workers}

    def replace(self, rank: int) -> Slot:
        h = self.h
        old = h.workers[rank]
        if not h.cluster.nodes[old.node_name].alive:  # Ray waits for the bundle
            raise startup_timeout(1)
        attempt = int(h.coordinator.attempt())
        h.workers[rank] = self._worker(old.slot, rank, len(h.workers), attempt)
        for w in h.workers:
            w.ctx.attempt = attempt  # the survivors rejoin the new attempt
        h.groups.append(Group(attempt, tuple(w.node_name for w in h.workers),
                              tuple(w.pid for w in h.workers), replaced=(rank,)))
        return old.slot

    def stopped(self) -> None:
        for w in self.h.workers:
            w.running = False
        self.h.workers = []
