"""Goodput (effective training time ratio, ETTR) of a run, from its event log (pure, no Ray).

*Productive* time is time spent on new steps; the rest of the wall time is *badput*, by cause:

- ``startup``: the run's start to the first step of the first attempt.
- ``restart``: a failure seen to the next attempt's first step, in phases: ``detection``
  (the first sign of the failure to the controller's ``worker_died``), ``teardown``
  (``worker_died`` to the controller starting the next group: ``group_start_time`` of the
  next ``attempt_started``), ``worker_start`` (to rank 0 beginning its set-up:
  ``setup_start_time``), ``setup`` (rayguard's set-up, to ``attempt_started``) and ``load``
  (the restore, to the first step: the first report, ``first_time``, less one measured
  step when the summary has the time ``load_state`` returned, ``begin_time``).
- ``replay``: steps an attempt ran again below the highest step reached before (from the
  restored step; counted in optimizer steps for a loop that reports rarer than it steps its
  optimizers), costed at that attempt's measured time per step (an attempt too short
  for a second step summary: timed from its first report to the last event recorded at a
  report, a fault, a NaN, a commit or a notice, less the checkpoints between).
- ``checkpoint``: time the loop was blocked on checkpoints (``blocked_s`` of each commit).
- ``stall``: the last progress to the watchdog's ``stall_detected`` (its
  ``last_progress_time``; a log without it: its timeout).
- ``preemption``: a preemption notice to the worker's end (the urgent checkpoint, the drain);
  when the just-in-time checkpoint came at a later step than the notice, the steps between
  are work, and preemption starts at ``preemption_checkpoint``.
- ``other``: what no cause explains (a failure that ended the run, to its end; a finished
  run's last report to the end of ``fit()``).

Wall time is partitioned: productive + every cause = wall time exactly. A log that lacks an
event (0.1-era logs, step summaries turned off) is read with what it has, and
:attr:`Goodput.not_measured` says what could not be measured.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rayguard.events.fields import event_time as _t
from rayguard.events.fields import integer as _int
from rayguard.events.fields import number as _num
from rayguard.observe.goodput_steps import (
    OPTIMIZER_UNIT,
    optimizer_counts,
    replay_in_optimizer_steps,
)
from rayguard.observe.goodput_steps import first_step_start as _first_step_start
from rayguard.observe.goodput_steps import lead_steps as _steps_of
from rayguard.observe.goodput_steps import span_step_time as _span_step_time
from rayguard.observe.goodput_steps import step_time as _step_time

CAUSES = ("startup", "restart", "resize", "replay", "checkpoint", "stall", "preemption", "other")
"""Every cause of badput, in the order shown (``resize``: a group resized in place)."""

RESTART_PHASES = ("detection", "teardown", "worker_start", "setup", "load")
"""The phases of a restart, in order; they sum to the ``restart`` cause."""

_SIGNS = ("stall_detected", "nan_detected", "diverged", "preemption_notice", "preflight_error",
          "worker_died", "fault_injected", "crash_loop", "not_retried")
"""Kinds that show an attempt failing (the earliest one is when the failure was seen)."""


@dataclass(frozen=True)
class AttemptGoodput:
    """One attempt: its span (seconds since the run's start), productive time and badput.
    An attempt's badput includes the restart that led to it (or the run's start-up)."""

    attempt: int
    start_s: float
    end_s: float
    productive_s: float
    badput_s: dict[str, float]
    restart_s: dict[str, float]
    outcome: str
    restored_step: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    replayed_steps: int = 0
    """In the run's :attr:`Goodput.replay_unit`."""
    step_time_s: float | None = None


@dataclass(frozen=True)
class Goodput:
    """A run's goodput: ``ratio`` = ``productive_s / wall_s``; ``badput_s`` has every cause
    of :data:`CAUSES`, ``restart_s`` every phase of :data:`RESTART_PHASES`."""

    wall_s: float
    productive_s: float
    ratio: float | None
    badput_s: dict[str, float]
    restart_s: dict[str, float]
    attempts: tuple[AttemptGoodput, ...] = ()
    not_measured: tuple[str, ...] = ()
    replayed_steps: int = 0
    restarts: int = 0
    step_unit: str = "step"
    """What the steps count: the ``step_unit`` the events record (a ``ray.train.report``
    loop's step key, e.g. ``"epoch"``, or ``"report"``), else ``"step"``."""
    replay_unit: str = "step"
    """What :attr:`replayed_steps` counts: ``"optimizer_step"`` for a loop that reports
    rarer than it steps its optimizers (a Trainer reporting every N steps), else
    :attr:`step_unit`."""
    resizes: int = 0
    """Attempts opened by an in-place resize (not counted in :attr:`restarts`)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        out = asdict(self)
        out["attempts"] = [asdict(a) for a in self.attempts]
        out["not_measured"] = list(self.not_measured)
        return out


def _first(evs: list[dict[str, Any]], *kinds: str) -> float | None:
    times = [t for e in evs if e.get("kind") in kinds and (t := _t(e)) is not None]
    return min(times) if times else None


@dataclass
class _Attempt:
    """What the log says about one attempt (times are epoch seconds)."""

    number: int
    events: list[dict[str, Any]]
    starting: float | None = None  # the controller began starting the group
    worker: float | None = None  # rank 0 began its set-up
    started: float | None = None  # attempt_started: the set-up done
    first: float | None = None  # the first step (first report)
    failed: float | None = None  # the failure first seen
    died: float | None = None  # the controller saw a worker die
    stall_s: float = 0.0
    preempted: bool = False
    ckpt_s: float = 0.0
    restored_step: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    step_time_s: float | None = None
    replay_time_s: float = 0.0  # the lead rank's measured time of replayed steps
    replay_steps: int = 0  # ... over this many steps (each after the attempt's first report)
    last_report: float | None = None  # the lead rank's last report (``last_time``)
    lead: list[dict[str, Any]] = field(default_factory=list)  # the lead rank's summaries
    outcome: str = "running"


def _preempted_end(evs: list[dict[str, Any]], failed: float | None) -> float | None:
    """The end of a preempted attempt's work: the notice, or, when the just-in-time checkpoint
    came at a later step, that checkpoint (the steps between were work it kept)."""
    notice = next((e for e in evs if e.get("kind") == "preemption_notice"), None)
    saved = next((e for e in evs if e.get("kind") == "preemption_checkpoint"), None)
    if notice is None or saved is None or failed is None or _t(notice) != failed:
        return failed
    step, saved_step, t = _int(notice.get("step")), _int(saved.get("step")), _t(saved)
    if step is None or saved_step is None or saved_step <= step or t is None or t <= failed:
        return failed
    return t


def _read_attempt(number: int, evs: list[dict[str, Any]], notes: list[str]) -> _Attempt:
    a = _Attempt(number, evs)
    begun = next((e for e in evs if e.get("kind") == "attempt_started"), {})
    a.starting = _num(begun.get("group_start_time"))
    a.worker = _num(begun.get("setup_start_time"))
    a.started = _t(begun) if begun else None
    steps = a.lead = _steps_of(evs)
    firsts = [x for e in steps if (x := _num(e.get("first_time")) or _t(e)) is not None]
    a.first = min(firsts) if firsts else None
    a.first_step = min((s for e in steps if (s := _int(e.get("first_step"))) is not None),
                       default=None)
    a.last_step = max((s for e in steps if (s := _int(e.get("last_step"))) is not None),
                      default=None)
    a.step_time_s = _step_time(steps)
    a.replay_time_s = sum(_num(e.get("replay_time_s")) or 0.0 for e in steps)
    a.replay_steps = sum(_int(e.get("replay_steps")) or 0 for e in steps)
    if a.step_time_s is None:
        a.step_time_s = _span_step_time(evs, steps)
    a.first = _first_step_start(a.first, steps, a.step_time_s)
    a.last_report = max((x for e in steps if (x := _num(e.get("last_time"))) is not None),
                        default=None)
    restored = next((e for e in evs if e.get("kind") == "restored"), None)
    a.restored_step = _int(restored.get("step")) if restored else None
    stall = next((e for e in evs if e.get("kind") == "stall_detected"), None)
    a.failed = _t(stall) if stall is not None else _preempted_end(evs, _first(evs, *_SIGNS))
    if stall is not None:
        timeout = _num(stall.get("timeout_s"))
        since = _num(stall.get("last_progress_time"))
        if timeout is None and since is None:
            notes.append(f"attempt {number}: the stall's timeout (stall_detected has no timeout_s)")
        a.stall_s = max((a.failed or 0.0) - since if since is not None else timeout or 0.0, 0.0)
    a.died = _first(evs, "worker_died")
    a.preempted = any(e.get("kind") == "preemption_notice" for e in evs)
    for e in evs:
        if e.get("kind") == "checkpoint_committed":
            a.ckpt_s += max(_num(e.get("blocked_s", e.get("seconds"))) or 0.0, 0.0)
    end = next((e.get("kind") for e in evs if e.get("kind") in ("finished", "failed")), None)
    a.outcome = "failed" if a.failed is not None else str(end or "running")
    return a


def _group(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        a = _int(e.get("attempt"))
        if a is not None:
            by[a].append(e)
    return by


class _Clock:
    """A cursor over the run's time: each segment starts where the last one ended, so the
    segments partition the wall time (out-of-order clocks clamp to zero)."""

    def __init__(self, t0: float) -> None:
        self.now = t0

    def take(self, until: float | None) -> float:
        if until is None or until <= self.now:
            return 0.0
        spent, self.now = until - self.now, until
        return spent


def _restart_phases(clock: _Clock, prev: _Attempt | None, a: _Attempt, ready: float | None,
                    badput: dict[str, float]) -> dict[str, float]:
    """The phases from ``prev``'s failure to ``a``'s first step (``ready``); a phase whose
    end was not recorded is 0 and the next one absorbs it."""
    phases = dict.fromkeys(RESTART_PHASES, 0.0)
    if prev is not None and prev.preempted:
        badput["preemption"] += clock.take(prev.died)
    else:
        phases["detection"] = clock.take(prev.died if prev else None)
    teardown_end = a.starting if a.starting is not None else _first(
        prev.events if prev else [], "restart")
    phases["teardown"] = clock.take(teardown_end)
    phases["worker_start"] = clock.take(a.worker if a.worker is not None else a.started)
    phases["setup"] = clock.take(a.started if a.worker is not None else None)
    phases["load"] = clock.take(ready)
    return phases


def _carve(window: float, a: _Attempt, prev_max: int | None,
           badput: dict[str, float]) -> tuple[float, int]:
    """Productive time of a progress window of ``window`` seconds: less the stall, the
    checkpoint blocking and the replayed steps (each at most what is left)."""
    left = window
    for cause, cost in (("stall", a.stall_s), ("checkpoint", a.ckpt_s)):
        spent = min(cost, left)
        badput[cause] += spent
        left -= spent
    replayed = 0
    start = a.first_step if a.first_step is not None else (
        a.restored_step + 1 if a.restored_step is not None else None)
    if prev_max is not None and start is not None:
        reached = _reached(a)
        top = prev_max if reached is None else min(prev_max, reached)
        replayed = max(top - start + 1, 0)
    replay_s = _replay_cost(a, replayed)
    if replay_s is not None:
        spent = min(replay_s, left)
        badput["replay"] += spent
        left -= spent
    return left, replayed


def _replay_cost(a: _Attempt, replayed: int) -> float | None:
    """The time of ``replayed`` steps: as the lead rank measured them (``replay_time_s``:
    each step after the attempt's first report), the first one and any it did not count at
    the attempt's time per step (``None``: no figure)."""
    if not replayed:
        return None
    measured = min(a.replay_steps, replayed - 1)
    if measured <= 0:
        return None if a.step_time_s is None else replayed * a.step_time_s
    cost = a.replay_time_s * measured / a.replay_steps
    rest = replayed - measured
    return cost + rest * a.step_time_s if a.step_time_s is not None else cost


def _reached(a: _Attempt) -> int | None:
    steps = [s for e in a.events if e.get("kind") not in ("restored", "start")
             and (s := _int(e.get("last_step", e.get("step")))) is not None]
    if a.last_step is not None:
        steps.append(a.last_step)
    return max(steps) if steps else None


def _zero() -> dict[str, float]:
    return dict.fromkeys(CAUSES, 0.0)


def goodput(events: Iterable[dict[str, Any]]) -> Goodput:
    """The goodput of a run's events (any order; unknown kinds are ignored)."""
    evs = sorted((e for e in events if _t(e) is not None), key=lambda e: _t(e) or 0.0)
    if not evs:
        return Goodput(0.0, 0.0, None, _zero(), dict.fromkeys(RESTART_PHASES, 0.0),
                       not_measured=("everything: the log has no events",))
    t0 = _first(evs, "start") or _t(evs[0]) or 0.0
    t_end = _t(evs[-1]) or t0
    notes: list[str] = []
    attempts = [_read_attempt(n, group, notes) for n, group in sorted(_group(evs).items())]
    clock = _Clock(t0)
    total, phases_total = _zero(), dict.fromkeys(RESTART_PHASES, 0.0)
    rows, productive, replayed, prev, prev_max = [], 0.0, 0, None, None
    resizes = 0
    has_steps = any(e.get("kind") == "steps" for e in evs)
    run_end = str(evs[-1].get("kind")) if evs[-1].get("kind") in ("finished", "failed") else None
    for i, a in enumerate(attempts):
        start_s, badput = clock.now - t0, _zero()
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        end = a.failed if a.failed is not None else (
            _t(nxt.events[0]) if nxt is not None else t_end)
        if a.outcome == "running" and nxt is None and run_end is not None:
            a.outcome = run_end
        if nxt is None and a.failed is None and run_end == "finished" and a.last_report:
            end = a.last_report  # the loop's last report; the rest is the end of fit()
        ready = _ready(a, end, has_steps, notes)
        if prev is None:
            badput["startup"] += clock.take(ready)
            phases = dict.fromkeys(RESTART_PHASES, 0.0)
        elif _resized_in_place(prev):  # node churn's own cost: the resize's time
            badput["resize"] += sum(_restart_phases(clock, prev, a, ready, badput).values())
            phases = dict.fromkeys(RESTART_PHASES, 0.0)
            resizes += 1
        else:
            phases = _restart_phases(clock, prev, a, ready, badput)
            badput["restart"] += sum(phases.values())
        good, again = _carve(clock.take(end), a, prev_max, badput)
        productive += good
        replayed += again
        rows.append(AttemptGoodput(a.number, start_s, clock.now - t0, good, badput, phases,
                                   a.outcome, a.restored_step, a.first_step, a.last_step,
                                   again, a.step_time_s))
        _add(total, badput)
        _add(phases_total, phases)
        reached = _reached(a)
        if reached is not None:
            prev_max = reached if prev_max is None else max(prev_max, reached)
        prev = a
    if run_end is None and prev is not None and prev.failed is not None:
        # a run still going after a failure: a restart under way (what the live figures see)
        phases_total["detection"] += clock.take(prev.died)
        phases_total["teardown"] += clock.take(t_end)
        total["restart"] = sum(phases_total.values())
    total["other"] += clock.take(t_end)
    _note_missing(evs, attempts, notes)
    if any(r.replayed_steps and r.step_time_s is None for r in rows):
        notes.append("replayed steps' time (no measured step time): counted as productive")
    unit = replay_unit = step_unit_of(evs)
    optimizer = replay_in_optimizer_steps([optimizer_counts(a.lead, r.replayed_steps)
                                           for a, r in zip(attempts, rows, strict=True)])
    if optimizer is not None:  # the loop reports rarer than it steps its optimizers
        counts, estimated = optimizer
        rows = [replace(r, replayed_steps=n) for r, n in zip(rows, counts, strict=True)]
        replayed, replay_unit = sum(counts), OPTIMIZER_UNIT
        notes += [f"attempt {rows[i].attempt}: its replayed optimizer steps (not counted): "
                  "estimated at the run's optimizer steps per report" for i in estimated]
    wall = t_end - t0
    return Goodput(wall, productive, productive / wall if wall > 0 else None, total, phases_total,
                   tuple(rows), tuple(dict.fromkeys(notes)), replayed,
                   max(len(attempts) - 1 - resizes, 0), unit, replay_unit, resizes)


def _resized_in_place(prev: _Attempt) -> bool:  # the next attempt is prev's resize
    return any(e.get("kind") == "resize" and e.get("path") == "live" for e in prev.events)


def step_unit_of(events: Iterable[dict[str, Any]]) -> str:
    """What a run's steps count: the last ``step_unit`` its events record (``restored``,
    ``checkpoint_committed``), else ``"step"``."""
    units = [u for e in events if isinstance(u := e.get("step_unit"), str) and u]
    return units[-1] if units else "step"


def _ready(a: _Attempt, end: float | None, has_steps: bool, notes: list[str]) -> float | None:
    """When attempt ``a`` made its first step (the end of its start-up or restart)."""
    if a.first is not None:
        return a.first
    if has_steps:
        return end  # step summaries are on, and this attempt sent none: it never stepped
    notes.append(f"attempt {a.number}: its first step (no step summaries): taken at the "
                 "restore, else at attempt_started")
    return _first(a.events, "restored") or a.started


def _add(into: dict[str, float], more: dict[str, float]) -> None:
    for k, v in more.items():
        into[k] += v


def _note_missing(evs: list[dict[str, Any]], attempts: list[_Attempt], notes: list[str]) -> None:
    kinds = {e.get("kind") for e in evs}
    if any(a.starting is None for a in attempts[1:]):
        notes.append("restart teardown apart from worker start (attempt_started has no "
                     "group_start_time): teardown ends at the restart decision")
    if any(a.worker is None for a in attempts[1:]):
        notes.append("restart set-up apart from worker start (attempt_started has no "
                     "setup_start_time)")
    if "checkpoint_committed" in kinds and not any(
            "blocked_s" in e for e in evs if e.get("kind") == "checkpoint_committed"):
        notes.append("checkpoint blocked time: taken as each commit's whole duration")
