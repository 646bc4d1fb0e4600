"""Which rank holds a hung group up (pure): :func:`find_culprits`.

Input: each rank's answer to a hang diagnosis, :class:`RankAnswer` (per process group the
last collective it entered, with its sequence number, op and tensor sizes, and the last one
it completed; where it runs; the top frame of its training thread), or ``None`` for a rank
that gave no answer within ``HealthConfig(diagnosis_wait_s)``. Output: one frozen
:class:`HangDiagnosis`.

Per process group, among the ranks that answered: the ranks inside a collective (entered >
completed) wait in the highest sequence number any of them entered, ``seq``. A member whose
last entered collective is below ``seq`` never arrived: it is *behind*. Ranks at ``seq``
whose op or sizes differ are a mismatch; the ranks outside the largest agreeing set are
*odd* (on a tie every rank at ``seq`` is odd). Sequence numbers are those of torch's Flight
Recorder (per group, the same on every rank) or of rayguard's counting hook
(:mod:`rayguard._torch.counting`).

Silence is not guilt: a rank blocked in a collective often cannot answer (a CUDA wait that
holds the GIL), so on a GPU the ranks that wait are the silent ones and the rank that holds
them up, sleeping or busy outside the collective, is the one that answers. Who is named
(the first row that applies; :attr:`HangDiagnosis.rule`):

==================  ===================================================  ==================
rule                when                                                 culprits
==================  ===================================================  ==================
``all_answered``    every rank answered                                  behind + odd (none:
                                                                         a transport fault,
                                                                         or a stall in the
                                                                         ranks' own code)
``behind``          some silent; an answered rank is inside a            behind + odd; the
                    collective and another answered rank is behind or    silent are taken as
                    odd                                                  waiting in it
``silent``          some silent; every answered member is inside the     the silent ranks
                    same collective at ``seq``, agreeing                 (only they can be
                                                                         holding it up)
``outside``         more than half of the world silent; no answered      the answered ranks
                    rank inside a collective; the answered ranks have    that recorded
                    collectives recorded (they stand between two)        collectives; the
                                                                         silent are taken as
                                                                         waiting
``silent_outside``  some silent; no answered rank inside a collective    the silent ranks
                    (half or fewer silent, or no collective recorded)    (wedged, holding the
                                                                         GIL, or dead)
==================  ===================================================  ==================

So 15 of 16 ranks silent in an all-reduce and rank 13 answering from between two steps
names rank 13 (``outside``), not the 15; at 8 ranks, ranks 0, 1, 2, 4 waiting in an
all-reduce, rank 6 behind and ranks 3, 5, 7 silent names rank 6 (``behind``). With 2 to 4
ranks the rows give what they gave before, but for ``behind`` (a silent rank beside one that
is behind is no longer named) and ``outside`` (3 of 4 silent and one answering from outside
any collective names the one that answered).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Collective:
    """One collective call of one rank."""

    pg: str
    """The process group's name (``"0"``: the default group)."""
    seq: int
    """Its sequence number in the group (1 for the group's first collective)."""
    op: str
    """``all_reduce``, ``broadcast``, ... (the backend's prefix removed)."""
    sizes: tuple[tuple[int, ...], ...] = ()
    """The input tensors' shapes."""


@dataclass(frozen=True)
class GroupState:
    """What one rank did last in one process group."""

    entered: Collective | None = None
    """The last collective it entered (``None``: none yet)."""
    completed: int = 0
    """The sequence number of the last one that completed (0: none)."""
    ranks: tuple[int, ...] = ()
    """The group's members as global ranks (``()``: unknown, taken as every rank)."""

    @property
    def in_collective(self) -> bool:
        return self.entered is not None and self.entered.seq > self.completed


@dataclass(frozen=True)
class RankAnswer:
    """One rank's answer to a hang diagnosis."""

    rank: int
    groups: Mapping[str, GroupState] = field(default_factory=dict)
    """Per process group name (empty: no torch.distributed, or nothing recorded)."""
    node: str | None = None
    gpu_ids: tuple[str, ...] = ()
    top_frame: str | None = None
    """``file:line in function`` of the training thread's innermost frame of user code."""
    stacks: str | None = None
    """The file this rank's stacks were dumped into."""


@dataclass(frozen=True)
class HangDiagnosis:
    """The decision: who holds the group up, and where."""

    culprits: tuple[int, ...]
    """Ranks that never entered the collective the others wait in, sent a different one,
    stand outside any collective while most are silent, or gave no answer where nothing
    else explains the hang (sorted; empty: nobody is behind). See the module's table."""
    waiting: tuple[int, ...]
    """Ranks blocked in the collective the culprits never entered (sorted)."""
    collective: Collective | None
    """The collective waited in (``None``: no rank is inside one)."""
    mismatch: str | None
    """What differs at that sequence number (``None``: no mismatch)."""
    silent: tuple[int, ...]
    """Ranks that gave no answer (culprits only where :attr:`rule` says so)."""
    nodes: dict[int, str | None]
    """Node id of each culprit."""
    gpu_ids: dict[int, tuple[str, ...]]
    """GPU ids of each culprit."""
    detail: str
    """One line a person can act on."""
    rule: str = "all_answered"
    """The row of the module's table that named the culprits (not in the event)."""

    def fields(self) -> dict[str, Any]:
        """The ``hang_diagnosed`` event's fields (JSON-ready)."""
        c = self.collective
        return {"culprits": list(self.culprits), "waiting": list(self.waiting),
                "collective": None if c is None else {"op": c.op, "pg": c.pg, "seq": c.seq,
                                                      "sizes": [list(s) for s in c.sizes]},
                "mismatch": self.mismatch, "silent": list(self.silent),
                "nodes": {str(r): n for r, n in self.nodes.items()},
                "gpu_ids": {str(r): list(g) for r, g in self.gpu_ids.items()}}


def _ranks(values: Sequence[int]) -> str:
    return ("rank " if len(values) == 1 else "ranks ") + ", ".join(str(r) for r in values)


def _span(values: Sequence[int]) -> str:
    """``ranks 0-12, 14, 15``: consecutive ranks as runs."""
    runs: list[list[int]] = []
    for r in sorted(values):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    text = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run))
                     for run in runs)
    return ("rank " if len(values) == 1 else "ranks ") + text


def _wait(values: Sequence[int]) -> str:
    return "waits" if len(values) == 1 else "wait"


def _where(answer: RankAnswer | None, rank: int, place: Mapping[int, Any]) -> str:
    node = answer.node if answer else (place.get(rank) or {}).get("node")
    gpus = answer.gpu_ids if answer else tuple((place.get(rank) or {}).get("gpu_ids") or ())
    out = f"rank {rank}" + (f" on node {node}" if node else "")
    return out + (f", GPU {','.join(gpus)}" if gpus else "")


def _member(state: GroupState, rank: int, world: Sequence[int]) -> bool:
    return rank in (state.ranks or world)


def _hung_group(answers: Mapping[int, RankAnswer]) -> tuple[str, int] | None:
    """``(pg, seq)`` waited in: the group with a rank inside a collective, its highest
    entered sequence number (on several, the one waited in by the most ranks)."""
    waits: dict[str, list[int]] = {}
    for answer in answers.values():
        for pg, state in answer.groups.items():
            if state.in_collective and state.entered is not None:
                waits.setdefault(pg, []).append(state.entered.seq)
    if not waits:
        return None
    pg = max(sorted(waits), key=lambda g: len(waits[g]))
    return pg, max(waits[pg])


def find_culprits(answers: Mapping[int, RankAnswer | None], world_size: int,
                  place: Mapping[int, Any] | None = None) -> HangDiagnosis:
    """The diagnosis of a hang from every rank's answer (``None``: no answer). ``place``:
    ``{rank: {"node", "gpu_ids"}}`` known from set-up, for the ranks that did not answer."""
    place = place or {}
    world = range(world_size)  # membership O(1): a list made each rank's check O(N)
    given = {r: a for r, a in answers.items() if a is not None}
    silent = tuple(r for r in world if given.get(r) is None)
    hung = _hung_group(given)
    behind: list[int] = []
    waiting: list[int] = []
    mismatch = None
    collective = None
    if hung is not None:
        pg, seq = hung
        at_seq: dict[int, Collective] = {}
        for r, answer in sorted(given.items()):
            state = answer.groups.get(pg)
            if state is None or not _member(state, r, world):
                continue
            if state.entered is not None and state.entered.seq == seq:
                at_seq[r] = state.entered
            elif state.entered is None or state.entered.seq < seq:
                behind.append(r)
        collective, waiting, odd, mismatch = _agree(at_seq)
        behind.extend(odd)
    rule, named = _rule(given, silent, world_size, inside=hung is not None, behind=behind)
    culprits = tuple(sorted(named))
    waiting = sorted(set(waiting) - set(culprits))
    diagnosis = HangDiagnosis(
        culprits=culprits, waiting=tuple(waiting), collective=collective, mismatch=mismatch,
        silent=silent,
        nodes={r: (given[r].node if r in given else (place.get(r) or {}).get("node"))
               for r in culprits},
        gpu_ids={r: (given[r].gpu_ids if r in given
                     else tuple((place.get(r) or {}).get("gpu_ids") or ())) for r in culprits},
        detail="", rule=rule)
    return _with_detail(diagnosis, given, place)


def _rule(given: Mapping[int, RankAnswer], silent: Sequence[int], world_size: int, *,
          inside: bool, behind: Sequence[int]) -> tuple[str, set[int]]:
    """``(rule, culprits)``: the first row of the module's table that applies."""
    if not silent:
        return "all_answered", set(behind)
    if behind:
        return "behind", set(behind)
    if inside:
        return "silent", set(silent)
    between = {r for r, answer in given.items() if answer.groups}
    if 2 * len(silent) > world_size and between:
        return "outside", between
    return "silent_outside", set(silent)


def _agree(at_seq: Mapping[int, Collective]
           ) -> tuple[Collective | None, list[int], list[int], str | None]:
    """``(collective, waiting, culprits, mismatch)`` among the ranks at the hung sequence
    number: the largest set that agrees on op and sizes waits; the others are culprits."""
    if not at_seq:
        return None, [], [], None
    sets: dict[tuple[str, tuple[tuple[int, ...], ...]], list[int]] = {}
    for r, c in sorted(at_seq.items()):
        sets.setdefault((c.op, c.sizes), []).append(r)
    if len(sets) == 1:
        ranks = next(iter(sets.values()))
        return at_seq[ranks[0]], ranks, [], None
    ordered = sorted(sets.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    seq = next(iter(at_seq.values())).seq
    mismatch = f"at #{seq}: " + "; ".join(
        f"{_ranks(ranks)} in {op} of {[list(s) for s in sizes]}" for (op, sizes), ranks in ordered)
    if len(ordered[0][1]) == len(ordered[1][1]):  # a tie: nobody can be told apart
        everyone = sorted(at_seq)
        return at_seq[ordered[0][1][0]], [], everyone, mismatch
    majority = ordered[0][1]
    odd = sorted(r for _, ranks in ordered[1:] for r in ranks)
    return at_seq[majority[0]], majority, odd, mismatch


def _with_detail(d: HangDiagnosis, given: Mapping[int, RankAnswer],
                 place: Mapping[int, Any]) -> HangDiagnosis:
    from dataclasses import replace

    c = d.collective
    what = f"{c.op} #{c.seq}" + ("" if c.pg == "0" else f" of group {c.pg}") if c else ""
    tail = f" that {_ranks(d.waiting)} {_wait(d.waiting)} in" if c is not None and d.waiting else ""
    parts = []
    for r in d.culprits:
        where = _where(given.get(r), r, place)
        answer = given.get(r)
        if answer is None:
            parts.append(f"{where} gave no answer (wedged, holding the GIL, or dead)")
            continue
        state = answer.groups.get(c.pg) if c is not None else None
        mine = state.entered if state else None
        if d.mismatch and c is not None and mine is not None and mine.seq == c.seq:
            waits = (f" while {_ranks(d.waiting)} {_wait(d.waiting)} in {c.op} of {[list(s) for s in c.sizes]}"
                     if d.waiting else "")
            parts.append(f"{where} entered {mine.op} of {[list(s) for s in mine.sizes]} "
                         f"as #{c.seq}{waits}")
        elif c is not None:
            parts.append(f"{where} never entered {what}{tail}")
        else:
            parts.append(f"{where} is stalled outside any collective")
        if answer.top_frame:
            parts[-1] += f"; its stack: {answer.top_frame}"
    unnamed = [r for r in d.silent if r not in d.culprits]
    if unnamed and parts:
        into = f"in {what}" if c is not None else "in the next collective"
        parts.append(f"{_span(unnamed)} gave no answer (taken as waiting {into}: a rank "
                     "blocked in a collective may not answer)")
    if not d.culprits:
        if c is not None:
            line = (f"{_ranks(d.waiting)} {_wait(d.waiting)} in {what}; none is behind "
                    "(a transport, device or network fault)")
        else:
            line = "no rank is inside a collective: the stall is in the ranks' own code"
    else:
        line = "; ".join(parts)
        if d.mismatch:
            line = f"mismatched collectives: {line}"
    return replace(d, detail=line)
