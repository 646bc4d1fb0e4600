"""The coordinator's side of a hang diagnosis: one per attempt, decided once.

The first rank whose watchdog fires opens the attempt's diagnosis (:meth:`Diagnoses.open`);
every rank's watchdog sees it open within a second (it polls the fact
``diagnosis:<attempt>``) and answers with its collective state and stacks
(:meth:`Diagnoses.answer`). The decision is made when every rank answered or when the
answer bound (``HealthConfig.diagnosis_wait_s``) has passed since the opening, whichever
comes first (the last answer, or a timer on the coordinator's event loop): the pure planner
:func:`rayguard.health.culprit.find_culprits` over the answers, one ``hang_diagnosed``
event. The opener awaits it in :meth:`Diagnoses.wait`, and so does every rank whose own
bound fires while the diagnosis is open: one future, no thread per waiter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayguard.events import make_event
from rayguard.health.culprit import Collective, GroupState, RankAnswer, find_culprits
from rayguard.run.waits import bounded


def open_key(attempt: int) -> str:
    """The fact every rank's watchdog polls: set while the attempt's diagnosis is open."""
    return f"diagnosis:{attempt}"


def place_key(attempt: int, rank: int) -> str:
    """Where a rank runs (``{"node", "gpu_ids"}``), left at set-up for a rank that will not
    answer."""
    return f"place:{attempt}:{rank}"


@dataclass
class _Open:
    opener: int
    world_size: int
    deadline: float
    opened: float
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    event: dict[str, Any] | None = None
    decided: asyncio.Future[bool] | None = None
    timer: asyncio.TimerHandle | None = None


def _group(value: Mapping[str, Any], pg: str) -> GroupState:
    entered = value.get("entered")
    collective = None if not entered else Collective(
        pg=pg, seq=int(entered["seq"]), op=str(entered.get("op") or "collective"),
        sizes=tuple(tuple(int(n) for n in s) for s in entered.get("sizes") or ()))
    return GroupState(entered=collective, completed=int(value.get("completed") or 0),
                      ranks=tuple(int(r) for r in value.get("ranks") or ()))


def rank_answer(value: Mapping[str, Any]) -> RankAnswer:
    """A worker's answer (plain data, as sent) for the planner."""
    return RankAnswer(rank=int(value["rank"]),
                      groups={str(pg): _group(g, str(pg))
                              for pg, g in (value.get("groups") or {}).items()},
                      node=value.get("node"), gpu_ids=tuple(str(g) for g in value.get("gpu_ids") or ()),
                      top_frame=value.get("top_frame"), stacks=value.get("stacks"))


class Diagnoses:
    """Every attempt's diagnosis, on the coordinator's event loop (call from its thread).
    ``record``: how the decided event is written; ``place``: a rank's set-up place;
    ``clock``: injectable. The decision is made once: by the last answer, or by a timer at
    the answer bound; every waiter awaits the same future."""

    def __init__(self, record: Callable[[dict[str, Any]], None],
                 place: Callable[[int, int], Any], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._record = record
        self._place = place
        self._clock = clock
        self._open: dict[int, _Open] = {}

    def open(self, attempt: int, rank: int, world_size: int, wait_s: float) -> bool:
        """Whether ``rank`` opened the attempt's diagnosis (``False``: another rank did)."""
        if attempt in self._open:
            return False
        now = self._clock()
        loop = asyncio.get_running_loop()
        state = self._open[attempt] = _Open(rank, world_size, now + wait_s, now,
                                            decided=loop.create_future())
        state.timer = loop.call_later(max(0.0, wait_s), self._decide, attempt)
        return True

    def answer(self, attempt: int, rank: int, value: dict[str, Any]) -> None:
        state = self._open.get(attempt)
        if state is not None and state.event is None:
            state.answers[rank] = value
            if len(state.answers) >= state.world_size:
                self._decide(attempt)

    async def wait(self, attempt: int, timeout_s: float) -> dict[str, Any] | None:
        """The attempt's ``hang_diagnosed`` event once decided (``None``: no diagnosis open,
        or still none after ``timeout_s``)."""
        state = self._open.get(attempt)
        if state is None:
            return None
        if state.event is None and state.decided is not None:
            await bounded(state.decided, timeout_s, shared=True)
        return None if state.event is None else dict(state.event)

    def _decide(self, attempt: int) -> None:
        state = self._open[attempt]
        if state.event is not None:
            return
        if state.timer is not None:
            state.timer.cancel()
        state.event = self._event(attempt, state)
        self._record(state.event)
        if state.decided is not None and not state.decided.done():
            state.decided.set_result(True)

    def _event(self, attempt: int, state: _Open) -> dict[str, Any]:
        answers = {r: (rank_answer(state.answers[r]) if r in state.answers else None)
                   for r in range(state.world_size)}
        place = {r: self._place(attempt, r) for r in range(state.world_size)
                 if r not in state.answers}
        diagnosis = find_culprits(answers, state.world_size, place)
        stacks = {str(r): a.get("stacks") for r, a in sorted(state.answers.items())}
        return make_event("hang_diagnosed", diagnosis.detail,
                          attempt=attempt, opened_by=state.opener, stacks=stacks,
                          answered=sorted(state.answers),
                          decided_after_s=round(self._clock() - state.opened, 3),
                          **diagnosis.fields())
