"""The link to the run: what a worker knows of its run, and its one client of the coordinator.

Set-up builds a :class:`RunLink` first (the worker's context plus the run's coordinator
actor) and hands it to every worker part: the checkpoint collective, the memory tier, the
preemption watch, the stall responder, the report bridge. Every call a worker makes to the
coordinator is a method here, with one timeout policy (:class:`LinkTimeouts`). A run
without a coordinator (a session in a unit test, a benchmark) gets a :class:`NullLink`:
events are logged only, a gather returns this rank's value, a claim is always won, a fact
is never there. No worker part checks for a missing coordinator itself.

A wait for peers counts as progress: a link built with :meth:`RunLink.feeding` calls the
watchdog's heartbeat while it waits (:meth:`RunLink.quiet`: a background thread's)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rayguard.exceptions import PeersLostError, RayGuardError
from rayguard.health.recovery import RecoveryKind
from rayguard.run.attempts import Attempt
from rayguard.run.memory_link import MemoryCalls, NullMemoryCalls
from rayguard.run.message_link import MessageCalls
from rayguard.run.poll import FactPoll
from rayguard.run.timeouts import LinkTimeouts

logger = logging.getLogger("rayguard")


class RunLink(MessageCalls, MemoryCalls):
    """A worker's link to its run: ``ctx`` (rank, attempt, node, world size) and the run's
    coordinator ``actor``. Built once per worker by set-up; treat it as read-only (the memory
    tier's calls: :class:`~rayguard.run.memory_link.MemoryCalls`)."""

    connected = True
    """Whether a coordinator answers (the memory tier needs one)."""

    def __init__(self, ctx: Any, actor: Any, *, timeouts: LinkTimeouts = LinkTimeouts(),
                 heartbeat: Callable[[], None] | None = None, alone: bool = False,
                 agent: Any = None) -> None:
        self.ctx = ctx
        """The worker's :class:`~rayguard.train.context.GuardContext`."""
        self.actor = actor
        self.agent = agent
        """This node's agent (:mod:`rayguard.run.agent`): gathers, watched facts, step
        summaries, events, facts left, failure records, reads and claims go through it
        (``None``: straight to the coordinator, a small run)."""
        self.timeouts = timeouts
        self._heartbeat = heartbeat
        self.alone = alone
        """Whether this worker gathers with no peer: it is its own replica group (Ray's
        ``TorchftConfig``), which Ray replaces on its own while the others run on, so a
        gather with the others could never complete for a replacement."""
        self._polls: dict[str, FactPoll] = {}  # shared by this link's copies (feeding)
        self._init_messages()  # rayguard/run/message_link.py

    @property
    def peers(self) -> int:
        """How many ranks a gather waits for: the world, or 1 when :attr:`alone`."""
        return 1 if self.alone else int(self.ctx.world_size)

    def feeding(self, heartbeat: Callable[[], None] | None) -> RunLink:
        """The same link whose waits call ``heartbeat`` (the training loop's link)."""
        link = type(self).__new__(type(self))
        link.__dict__.update(self.__dict__, _heartbeat=heartbeat)
        return link

    def quiet(self) -> RunLink:
        """The same link whose waits are not progress (a background thread's)."""
        return self.feeding(None)

    def progress(self) -> None:
        """This rank is making progress (a heartbeat, where this link feeds one)."""
        if self._heartbeat is not None:
            self._heartbeat()

    # -- facts (events, marks, reads, claims: rayguard/run/message_link.py) ---------------
    def high_step(self) -> int | None:
        """The highest step the run is known to have reached (``None``: unknown)."""
        import ray

        try:
            value = ray.get(self.actor.high_step.remote(), timeout=self.timeouts.answer_s)
        except Exception as exc:  # a goodput figure: never fail a restore for it
            logger.debug("rayguard: the run's highest step is unknown: %s", exc)
            return None
        return value if isinstance(value, int) else None

    def wait_for(self, key: str, timeout_s: float | None = None) -> Any:
        """A fact another rank leaves, waited for (a wait is progress); raises
        :class:`RayGuardError` when it is not there within ``timeout_s``."""
        timeout_s = self.timeouts.fact_s if timeout_s is None else timeout_s
        value = self.wait_fact(key, timeout_s)
        if value is None:
            raise RayGuardError(f"rank {self.ctx.rank}: no answer for {key!r} in {timeout_s} s")
        return value

    def wait_fact(self, key: str, timeout_s: float) -> Any:
        """The fact ``key`` once there, ``None`` after ``timeout_s`` (a wait is progress):
        the coordinator answers when it appears, one question in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            value = self._await(self._near.wait_fact.remote(
                key, max(0.0, min(left, self.timeouts.hold_s))))
            if value is not None or deadline - time.monotonic() <= 0:
                return value

    def _await(self, ref: Any) -> Any:
        """``ref``'s value, feeding the watchdog while it waits."""
        import ray

        while True:
            ready, _ = ray.wait([ref], timeout=self.timeouts.poll_s)
            if ready:
                return ray.get(ref)
            self.progress()

    def open_attempt(self, kind: RecoveryKind) -> Attempt:
        """Open the run's next attempt at the coordinator, its one owner (an in-place
        rollback's: :mod:`rayguard.run.attempts`); returns it."""
        import ray

        return ray.get(self.actor.open_attempt.remote(kind), timeout=self.timeouts.answer_s)

    # -- the gather ---------------------------------------------------------------------------
    def gather(self, tag: str, value: Any, *, kept: bool = False,
               timeout_s: float | None = None, root: int | None = None) -> list[Any]:
        """All ranks' values for ``tag`` in rank order (a tag is used once per attempt).
        ``kept``: the whole world's, even for a rank :attr:`alone`, and kept for a rank that
        joins later in place of one (set-up facts); ``timeout_s``: the coordinator's bound;
        ``root``: only that rank gets every value, the others the errors only
        (:func:`rayguard.run.waits.errors_only`: a commit's records). Raises
        :class:`PeersLostError` when it cannot complete (a peer lost, a bound)."""
        if self.peers == 1 and not kept:
            return [value]
        bound = 1800.0 if timeout_s is None else timeout_s
        result = self._await(self._gather_ref(tag, value, bound, kept, root))
        if result is None:
            raise PeersLostError(f"rank {self.ctx.rank}: peers lost before {tag!r}")
        return list(result)

    def contribute(self, tag: str, value: Any) -> None:
        """Join the gather ``tag`` without waiting for its result (a rank with nothing to
        add where some peers may have something)."""
        if self.peers == 1:
            return
        self._gather_ref(tag, value, 1800.0, False, -1)

    @property
    def _near(self) -> Any:
        """Who a rank asks for what every rank asks at once: its node's agent, or the
        coordinator."""
        return self.actor if self.agent is None else self.agent

    def _gather_ref(self, tag: str, value: Any, bound: float, kept: bool,
                    root: int | None) -> Any:
        ctx, full = self.ctx, f"a{self.ctx.attempt}:{tag}"
        if self.agent is None:
            return self.actor.gather.remote(full, ctx.rank, ctx.world_size, value, bound, kept,
                                            root)
        local = int(getattr(ctx, "local_world_size", 0) or 0)
        return self.agent.gather.remote(full, ctx.rank, ctx.world_size, value, bound, kept,
                                        local, root)

    # -- checkpoints rejected by any rank or attempt -------------------------------------------
    def rejected_checkpoints(self) -> dict[str, str]:
        import ray

        return dict(ray.get(self.actor.rejected_checkpoints.remote(),
                            timeout=self.timeouts.answer_s))

    def reject_checkpoint(self, path: str, why: str) -> None:
        self.actor.reject_checkpoint.remote(path, why)

    # -- how the attempt goes -------------------------------------------------------------------
    def send_progress(self, update: dict[str, Any], *, wait: bool = False) -> None:
        """Rank 0's latest step and metrics (the driver's progress line)."""
        ref = self.actor.progress.remote(update)
        if wait:
            import ray

            try:
                ray.get(ref, timeout=self.timeouts.ack_s)
            except Exception as exc:
                logger.debug("rayguard: could not send the final metrics: %s", exc)

    def send_summary(self, summary: dict[str, Any], *, wait: bool = False) -> None:
        """Step timing (see rayguard.observe.steps), fire-and-forget unless ``wait``."""
        try:
            ref = (self.actor.step_summary.remote(summary) if self.agent is None or wait
                   else self.agent.summary.remote(summary))
            if wait:
                import ray

                ray.get(ref, timeout=self.timeouts.ack_s)
        except Exception as exc:  # observing must never break the loop
            logger.debug("rayguard: step summary not sent: %s", exc)

    # -- hang diagnosis (rayguard.health.hang, rayguard.run.diagnosis) ---------------------
    def open_diagnosis(self, wait_s: float) -> bool | None:
        """Open this attempt's hang diagnosis: ``True``: this rank opened it, ``False``: a
        peer had; ``None``: no coordinator answered (the rank acts alone, as before)."""
        import ray

        ctx = self.ctx
        try:
            return bool(ray.get(self.actor.open_diagnosis.remote(
                ctx.attempt, ctx.rank, ctx.world_size, wait_s), timeout=self.timeouts.ack_s))
        except Exception as exc:
            logger.debug("rayguard: could not open a hang diagnosis: %s", exc)
            return None

    def answer_diagnosis(self, answer: dict[str, Any]) -> None:
        """This rank's collective state and stacks (waited for: the decision needs it)."""
        import ray

        ctx = self.ctx
        try:
            ref = (self.actor.answer_diagnosis.remote(ctx.attempt, ctx.rank, answer)
                   if self.agent is None else self.agent.answer_diagnosis.remote(
                       ctx.attempt, ctx.rank, answer, int(getattr(ctx, "local_world_size", 0) or 0)))
            ray.get(ref, timeout=self.timeouts.ack_s)
        except Exception as exc:
            logger.debug("rayguard: could not answer the hang diagnosis: %s", exc)

    def await_diagnosis(self, timeout_s: float) -> dict[str, Any] | None:
        """The attempt's ``hang_diagnosed`` event once decided (``None``: not in time)."""
        import ray

        try:
            return ray.get(self.actor.await_diagnosis.remote(self.ctx.attempt, timeout_s),
                           timeout=timeout_s + self.timeouts.ack_s)
        except Exception as exc:
            logger.debug("rayguard: no hang diagnosis: %s", exc)
            return None

    def diagnosis_poll(self) -> FactPoll:
        """A non-blocking watch of whether this attempt's diagnosis is open."""
        from rayguard.run.diagnosis import open_key

        return self.fact_poll(open_key(self.ctx.attempt))

    def fact_poll(self, key: str) -> FactPoll:
        """A non-blocking watch of the fact ``key``, one per key whoever asks (a rank)."""
        if key not in self._polls:
            self._polls[key] = FactPoll(self._near, key, hold_s=self.timeouts.hold_s)
        return self._polls[key]


class NullLink(NullMemoryCalls, RunLink):
    """The link of a worker without a coordinator: events are logged only, a gather returns
    this rank's value, a claim is always won, facts are never there."""

    connected = False

    def __init__(self, ctx: Any, *, timeouts: LinkTimeouts = LinkTimeouts(),
                 heartbeat: Callable[[], None] | None = None) -> None:
        super().__init__(ctx, None, timeouts=timeouts, heartbeat=heartbeat)

    def _send_event(self, event: dict[str, Any], wait: bool) -> None:
        return None

    def open_attempt(self, kind: RecoveryKind) -> Attempt:
        return Attempt(int(self.ctx.attempt) + 1, RecoveryKind(kind), opened_at=time.time())

    def mark(self, key: str, value: Any) -> None:
        return None

    def put(self, key: str, value: Any) -> None:
        return None

    def get(self, key: str) -> Any:
        return None

    def high_step(self) -> int | None:
        return None

    def wait_for(self, key: str, timeout_s: float | None = None) -> Any:
        return None

    def wait_fact(self, key: str, timeout_s: float) -> Any:
        return None

    def claim(self, key: str) -> bool:
        return True

    def gather(self, tag: str, value: Any, *, kept: bool = False,
               timeout_s: float | None = None, root: int | None = None) -> list[Any]:
        return [value]

    def contribute(self, tag: str, value: Any) -> None:
        return None

    def rejected_checkpoints(self) -> dict[str, str]:
        return {}

    def reject_checkpoint(self, path: str, why: str) -> None:
        return None

    def record_failure(self, exc: BaseException, last_step: int) -> None:
        return None

    def send_progress(self, update: dict[str, Any], *, wait: bool = False) -> None:
        return None

    def send_summary(self, summary: dict[str, Any], *, wait: bool = False) -> None:
        return None

    def open_diagnosis(self, wait_s: float) -> bool | None:
        return None

    def answer_diagnosis(self, answer: dict[str, Any]) -> None:
        return None

    def await_diagnosis(self, timeout_s: float) -> dict[str, Any] | None:
        return None

    def fact_poll(self, key: str) -> FactPoll:
        return FactPoll(None, "")


def make_link(ctx: Any, actor: Any, *, timeouts: LinkTimeouts = LinkTimeouts(),
              alone: bool = False, agents: str | None = None) -> RunLink:
    """The link of a worker: a :class:`RunLink` over ``actor``, or a :class:`NullLink` when
    the run has no coordinator; ``alone``: see :attr:`RunLink.alone`; ``agents``: the
    ``RAYGUARD_NODE_AGENTS`` setting (:func:`rayguard.run.agent.wants_agents`)."""
    if actor is None:
        return NullLink(ctx, timeouts=timeouts)
    from rayguard.run.agent import find_agent, wants_agents

    agent = None
    if wants_agents(int(ctx.world_size), agents):
        agent = find_agent(actor, str(ctx.node_id), timeouts.answer_s)
    return RunLink(ctx, actor, timeouts=timeouts, alone=alone, agent=agent)
