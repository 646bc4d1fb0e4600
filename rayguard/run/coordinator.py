"""RunCoordinator: one small Ray actor per ``fit()`` that outlives worker-group restarts.

It holds what must survive a restart of the worker group: the run's attempts (their one
owner, :class:`~rayguard.run.attempts.Attempts`), faults already fired, checkpoints already
rejected, and the event log; and it offers the one collective rayguard needs outside
torch.distributed (a gather keyed by tag, :mod:`rayguard.run.gather_host`), so that set-up
and checkpoint commits work whatever backend (gloo, NCCL) the user's group runs.

An asyncio actor: every method runs on its one event loop thread (no locks), and every wait
(gathers, facts, the hang diagnosis, the memory tier's) is a future completed by the call
that makes it true (:mod:`rayguard.run.waits`), never a thread per waiting rank: no cap on
the world size, O(1) work per arrival.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from rayguard.events import EventLog
from rayguard.events.kinds import NOTABLE_KINDS
from rayguard.failures.taxonomy import is_kill_mark
from rayguard.health.crash_loop import FailureRecord, crash_loop
from rayguard.health.eviction import RankScore
from rayguard.health.live import LAST_COMMITTED_KEY, live_key, opened_key
from rayguard.health.quarantine import NodeFailure
from rayguard.health.recovery import LIVE, RESIZE, RecoveryKind
from rayguard.observe.observer import RunObserver
from rayguard.observe.progress import attempt_view
from rayguard.run.attempts import Attempt, Attempts
from rayguard.run.diagnosis import Diagnoses, open_key, place_key
from rayguard.run.facts import CAUSE, KILLED, cause_key, loaded_key, rank_fact
from rayguard.run.fence import NodeFence
from rayguard.run.gather_host import GatherHost
from rayguard.run.memory_host import MemoryHost
from rayguard.run.outbox import EVENT, FACT, FAILURE, OFFER, Delivered, Message
from rayguard.run.relay import relay_of
from rayguard.run.waits import MAX_WAITERS, FactBoard, bounded


class RunCoordinator(GatherHost, MemoryHost):
    """The actor body. Create it with :func:`start_coordinator` (its gathers:
    :class:`~rayguard.run.gather_host.GatherHost`; its memory-tier methods:
    :class:`~rayguard.run.memory_host.MemoryHost`)."""

    def __init__(self, events_file: str, observe: dict[str, Any] | None = None,
                 fence: dict[str, Any] | None = None) -> None:
        self._log = EventLog(events_file)
        self._observer = RunObserver(**(observe or {"run": "run", "metrics": None}))
        self._fence = NodeFence(**(fence or {"quarantine_after": None}))
        self._attempts = Attempts()
        self._claims: set[str] = set()
        self._rejected: dict[str, str] = {}
        self._facts = FactBoard()
        self._delivered = Delivered()  # message ids acted on (rayguard/run/outbox.py)
        self._init_gathers()  # rayguard/run/gather_host.py
        self._agents: dict[str, Any] = {}  # node -> its agent (rayguard/run/agent.py)
        self._failures: dict[int, list[FailureRecord]] = {}
        self._commits: dict[int, int] = {}
        self._progress: dict[str, Any] = {}
        self._high_step: int | None = None
        """The highest step the run is known to have reached (reports, summaries, faults)."""
        self._commit_steps: list[int] = []
        """Steps of the checkpoints this fit() committed, in commit order."""
        self._notable: list[dict[str, Any]] = []
        self._init_memory()  # the memory tier (rayguard/run/memory_host.py)
        self._diagnoses = Diagnoses(self._record_diagnosis,
                                    lambda attempt, rank: self._facts.get(place_key(attempt, rank)))

    # -- attempts and events -------------------------------------------------------------
    def open_attempt(self, kind: RecoveryKind | str, failed: int | None = None,
                     replaced: list[int] | None = None, detail: str = "",
                     resize: dict[str, Any] | None = None, within_s: float | None = None
                     ) -> Attempt:
        """Open the run's next attempt (its one opener); returns it. ``LIVE`` replaces
        ``replaced`` of ``failed`` alone, ``RESIZE`` resizes the group in place (``resize``:
        :mod:`rayguard.controller.resize`): the survivors get their notice (``live_key`` of
        ``failed``, with ``detail`` and ``within_s``: :func:`rayguard.health.live.setup_wait_s`)
        and every wait of ``failed`` is released."""
        if (kind := RecoveryKind(kind)) not in (LIVE, RESIZE):
            return self._attempts.open(kind, replaced=replaced or ())
        if failed is None:
            raise ValueError(f"open_attempt({kind.name}): name the failed attempt to leave")
        opened = self._attempts.open(kind, replaced=replaced or ())
        notice = {"attempt": opened.number, "ranks": list(opened.replaced), "at": opened.opened_at,
                  "detail": detail, **({"resize": resize} if resize else {}),
                  **({"setup_within_s": within_s} if within_s else {})}
        self._facts.put(live_key(failed), notice)
        self._facts.put(opened_key(opened.number), notice)
        self._gathers.release(f"a{failed}:")
        return opened

    def latest_attempt(self) -> Attempt | None:
        """The attempt opened last, as it opened (``None``: none yet)."""
        return self._attempts.latest

    def attempt(self) -> int:
        """The number of the attempt running now (0 before the first opens)."""
        return self._attempts.current

    def record(self, event: dict[str, Any]) -> None:
        if event.get("attempt") is None:
            event["attempt"] = self.attempt()
        if event.get("kind") == "checkpoint_committed":
            attempt = event["attempt"]
            self._commits[attempt] = self._commits.get(attempt, 0) + 1
            if isinstance(event.get("step"), int):
                self._commit_steps.append(event["step"])
            self._facts.put(LAST_COMMITTED_KEY, event.get("path"))
        if event.get("kind") == "restart":
            self._stamp_progress(event)
        if event.get("kind") not in ("restored", "start"):
            self._reached(event.get("last_step", event.get("step")))
        if event.get("kind") in NOTABLE_KINDS:
            self._notable.append(event)
        if event.get("kind") == "attempt_started":
            opened = self._attempts.get(event["attempt"])
            if opened is not None:  # the start of the restart's worker-start phase (goodput)
                event.setdefault("group_start_time", opened.opened_at)
        self._observer.annotate(event)
        self._log.append(event)
        self._observer.emit(event)

    def _stamp_progress(self, event: dict[str, Any]) -> None:
        """A restart says the last step rank 0 reported in the attempt that failed
        (``last_step``, ``last_step_time``: sent every few seconds, fresher than the last
        step summary), so that goodput knows more of the steps the next attempt replays."""
        progress = self._progress
        step = progress.get("step")
        if progress.get("attempt") == event.get("attempt") and isinstance(step, int):
            event.setdefault("last_step", step)
            event.setdefault("last_step_time", progress.get("time"))

    def deliver(self, messages: list[Message]) -> None:
        """Ranks' messages (a node's, sent together by its agent, or one a rank sent straight
        when its agent did not take it), in order; each id is acted on once."""
        for kind, mid, payload in messages:
            if not self._delivered.first(mid):
                continue
            if kind == EVENT:
                self.record(payload)
            elif kind == FACT:
                self.put(*payload)
            elif kind == FAILURE:
                self.record_failure(*payload)
            elif kind == OFFER:  # rayguard/run/memory_host.py
                self.memory_offer(*payload)

    def step_summary(self, summary: dict[str, Any]) -> None:
        """A rank's step timing since its last summary (fire-and-forget from the worker):
        logged as a ``steps`` event, exported as metrics, checked for stragglers."""
        self.step_summaries([summary])

    def notable_events(self, since: int = 0) -> list[dict[str, Any]]:
        """Events a person must see, from index ``since`` on (the driver prints them)."""
        return self._notable[since:]

    # -- failures and crash loops ----------------------------------------------------------
    def record_failure(self, rank: int, attempt: int, error_type: str, origin: str, step: int,
                       summary: str, traceback: str = "") -> None:
        """A worker's training function ended with an exception (called before it re-raises)."""
        record = FailureRecord(rank=rank, attempt=attempt, error_type=error_type, origin=origin,
                               step=step, commits=self._commits.get(attempt, 0), summary=summary,
                               traceback=traceback[-20000:])
        self._failures.setdefault(attempt, []).append(record)

    def failed_ranks(self, attempt: int) -> dict[int, FailureRecord]:
        """The failure records of the ranks whose training function raised in ``attempt``
        (each records its failure before its error leaves the worker, so a poll of Ray's may
        not show it yet)."""
        return {record.rank: record for record in self._failures.get(attempt, ())}

    def crash_loop(self, failed_ranks: int, retries: int) -> FailureRecord | None:
        """The record proving that the current attempt repeats a failure, or None."""
        history = {a: list(r) for a, r in self._failures.items()}
        return crash_loop(history, self.attempt(), failed_ranks=failed_ranks, retries=retries,
                          deaths=self._deaths())

    def _deaths(self) -> set[int]:
        """Attempts in which a worker was killed: by rayguard's watchdog or an injected kill
        (the worker left its cause before it went)."""
        facts = ((rank_fact(key), value) for key, value in self._facts.items())
        return {f.attempt for f, value in facts
                if f is not None and f.kind == CAUSE and is_kill_mark(value)}

    def kills(self) -> dict[int, dict[str, str]]:
        """Ranks of the current attempt that rayguard's watchdog killed: ``{rank: {"bound",
        "reason"}}`` (the driver's final error names them)."""
        attempt, out = self.attempt(), {}
        for key, value in self._facts.items():
            fact = rank_fact(key)
            if fact is not None and fact.kind == KILLED and fact.attempt == attempt:
                cause = str(self._facts.get(cause_key(attempt, fact.rank), ""))
                out[fact.rank] = {"bound": cause.rsplit(": ", 1)[-1] or "stall",
                                  "reason": str(value)}
        return out

    def loaded_checkpoint(self, attempts: list[int]) -> str | None:
        """The checkpoint every one of ``attempts`` resumed from (``None``: they differ, or
        one started fresh)."""
        paths = {self._facts.get(loaded_key(a)) for a in attempts}
        return paths.pop() if len(paths) == 1 else None

    def failures(self) -> dict[int, list[FailureRecord]]:
        return {a: list(r) for a, r in self._failures.items()}

    # -- quarantine (rayguard/run/fence.py) -----------------------------------------------
    def record_node_failures(self, failures: list[NodeFailure],
                             nodes_alive: int | None = None) -> list[str]:
        """Count several node failures at once (the controller: one attempt's workers);
        returns the nodes this quarantined."""
        events = self._fence.record(failures, nodes_alive)
        for event in events:
            self.record(event)
        return [e["node"] for e in events]

    def excluded_nodes(self) -> list[str]:
        """The nodes the next worker group leaves out (re-reading the run directory's
        quarantine file: a lift takes effect here)."""
        nodes, events = self._fence.excluded(self.attempt())
        for event in events:
            self.record(event)
        return nodes

    def quarantined_nodes(self) -> dict[str, dict[str, Any]]:
        """``{node: {"reason", "failures"}}`` of the nodes left out now."""
        return self._fence.quarantined()

    # -- progress (the driver's console line and Result's last metrics) -------------------
    def progress(self, update: dict[str, Any]) -> None:
        """Rank 0's step, metrics, time and world size, stamped with the attempt they are of
        (the one running now unless the update names its own)."""
        self._progress.update(dict({"attempt": self.attempt()}, **update))
        self._reached(update.get("step"))

    def _reached(self, step: Any) -> None:
        if isinstance(step, int) and not isinstance(step, bool):
            self._high_step = step if self._high_step is None else max(self._high_step, step)

    def high_step(self) -> int | None:
        """The highest step the run is known to have reached: a restored attempt replays the
        steps up to it (what the goodput planner reads from the log)."""
        return self._high_step

    def get_progress(self) -> dict[str, Any]:
        """The progress line's data: the running attempt's step (none until it reported),
        the last metrics, and the step of this ``fit()``'s last checkpoint at or before that
        step (:func:`rayguard.observe.progress.attempt_view`)."""
        return attempt_view(self._progress, self.attempt(), list(self._commit_steps))

    def close(self) -> None:
        """End of fit(): every waiter gets its answer (none) before the actor is killed."""
        self._gathers.close()
        self._facts.close()

    def events_file(self) -> str:
        return str(self._log.path)

    # -- once-per-run facts ------------------------------------------------------------
    def claim(self, key: str) -> bool:
        if key in self._claims:
            return False
        self._claims.add(key)
        return True

    def reject_checkpoint(self, path: str, why: str) -> None:
        self._rejected[path] = why

    def rejected_checkpoints(self) -> dict[str, str]:
        return dict(self._rejected)

    def put(self, key: str, value: Any) -> None:
        self._facts.put(key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return self._facts.get(key, default)

    def get_many(self, keys: list[str]) -> list[Any]:  # a node's reads (rayguard/run/node_asks.py)
        return [self._facts.get(k) for k in keys]

    def present(self, keys: list[str]) -> list[str]:  # those of ``keys`` that hold a fact
        return [k for k in keys if self._facts.get(k) is not None]

    async def wait_fact(self, key: str, timeout_s: float) -> Any:
        """The fact ``key`` once there (at once when it is); ``None`` after ``timeout_s``:
        a long poll, so a rank watching a fact asks once per ``timeout_s``, not per second."""
        return await bounded(self._facts.wait(key), timeout_s)

    # -- hang diagnosis (rayguard/run/diagnosis.py) ---------------------------------------
    def open_diagnosis(self, attempt: int, rank: int, world_size: int, wait_s: float) -> bool:
        """A rank's watchdog fired: open the attempt's diagnosis (``False``: already open)."""
        opened = self._diagnoses.open(attempt, rank, world_size, wait_s)
        self._facts.put(open_key(attempt), True)
        return opened

    def _record_diagnosis(self, event: dict[str, Any]) -> None:
        """Record the attempt's ``hang_diagnosed`` event, and count each culprit's node
        against it (``hang_culprit``: the quarantine rule, rayguard/run/fence.py)."""
        self.record(event)
        nodes = event.get("nodes") or {}
        failures = [NodeFailure(str(nodes[str(rank)]), int(event["attempt"]), "hang_culprit",
                                rank, str(event.get("detail") or "")[:300])
                    for rank in event.get("culprits") or () if nodes.get(str(rank))]
        if failures:
            self.record_node_failures(failures, _nodes_alive())

    def answer_diagnosis(self, attempt: int, rank: int, answer: dict[str, Any]) -> None:
        self._diagnoses.answer(attempt, rank, answer)

    def answer_diagnosis_many(self, attempt: int, answers: dict[int, dict[str, Any]]) -> None:
        """A node's ranks' answers, sent together by its agent."""
        for rank, answer in answers.items():
            self._diagnoses.answer(attempt, int(rank), answer)

    async def await_diagnosis(self, attempt: int, timeout_s: float) -> dict[str, Any] | None:
        """The attempt's ``hang_diagnosed`` event once decided (``None``: not in time)."""
        return await self._diagnoses.wait(attempt, timeout_s)

    # -- node agents (rayguard/run/agent.py) -----------------------------------------------
    def node_agent(self, node: str, pin: bool = True) -> Any:
        """The agent of ``node`` (started on first use, owned by this actor: it lives as long
        as the run); ``pin``: on that node (False: a benchmark's simulated node)."""
        import ray

        from rayguard.run.agent import start_agent

        agent = self._agents.get(node)
        if agent is None:
            context = ray.get_runtime_context()
            lead = relay_of(len(self._agents))  # the agents in start order, in groups
            relay = None if lead is None else list(self._agents.values())[lead]
            agent = self._agents[node] = start_agent(context.current_actor,
                                                     cast(str, context.get_actor_id()), node,
                                                     pin=pin, relay=relay)
        return agent

    async def end(self, event: dict[str, Any], timeout_s: float = 10.0) -> None:
        """The run's last event (``finished``, ``failed``), written after the step summaries
        its node agents still hold (they batch for seconds; at most ``timeout_s``)."""
        if self._agents:
            flushes = asyncio.gather(*(a.flush.remote() for a in self._agents.values()),
                                     return_exceptions=True)
            try:
                await asyncio.wait_for(flushes, timeout_s)
            except asyncio.TimeoutError:  # observing never holds the run's end longer
                pass
            # what the flush wrote is stamped now; the log is read by time: the end stays last
            event["time"] = max(float(event.get("time") or 0.0), time.time())
        self.record(event)

    def step_summaries(self, batch: list[dict[str, Any]]) -> None:
        """Several ranks' summaries (a node's, sent together by its agent): the straggler
        rule and the eviction judged once for the batch."""
        if not batch:
            return
        for summary in batch:
            self._reached(summary.get("last_step"))
        for event in self._observer.on_summaries(batch, merge=len(batch) > 1):
            self.record(event)
        if self._fence.eviction is not None:
            ranks = {r: RankScore(*s) for r, s in self._observer.states().items()}
            last = batch[-1]
            now = float(last.get("time") or time.time())
            for event in self._fence.on_scores(int(last.get("attempt") or 0), now, ranks):
                self.record(event)

    def step_summaries_nodes(self, batches: list[list[dict[str, Any]]]) -> None:
        """Several nodes' batches of summaries in one call (a relay's group,
        :mod:`rayguard.run.relay`): each judged and logged as its node's own call was."""
        for batch in batches:
            self.step_summaries(batch)


def _nodes_alive() -> int | None:
    """How many nodes the cluster has alive (``None``: not known, outside Ray)."""
    from rayguard._ray.core import alive_node_resources

    try:
        return len(alive_node_resources())
    except Exception:
        return None


def start_coordinator(events_file: str, observe: dict[str, Any] | None = None,
                      fence: dict[str, Any] | None = None):
    """Start the run's coordinator on the driver's node (no CPU reserved). ``observe``: the
    :class:`~rayguard.observe.observer.RunObserver` arguments (run name, straggler rule);
    ``fence``: the :class:`~rayguard.run.fence.NodeFence` arguments (quarantine rule, file)."""
    import ray

    from rayguard._ray.core import node_id_label

    node_id = ray.get_runtime_context().get_node_id()
    return ray.remote(RunCoordinator).options(
        num_cpus=0, max_concurrency=MAX_WAITERS, label_selector={node_id_label(): node_id},
    ).remote(events_file, observe, fence)
