"""What the goodput planner reads of a log, in bounded memory (pure): :class:`CompactLog`
keeps a few events per attempt however long the run and however many ranks, and
``goodput(log.events())`` equals :func:`rayguard.observe.goodput.goodput` of every event
added. The run's coordinator keeps one for the live goodput metric
(:mod:`~rayguard.observe.goodput_meter`); ``rayguard events --goodput`` and the report fold
a whole log into one (:mod:`~rayguard.observe.digest`), in parts when it reads the log in
parallel (:meth:`CompactLog.merge`).
"""

from __future__ import annotations

from typing import Any

from rayguard.events.fields import integer
from rayguard.events.fields import number as _num
from rayguard.events.summary import StepSummary

_DROP = ("samples", "details", "stacks", "guard_config", "detail")
"""Fields of a kept event the planner never reads (a stack dump's text, a config)."""


def _merge_commit(into: dict[str, Any], e: dict[str, Any]) -> None:
    """One attempt's commits as one: their blocked seconds added (as the planner sums them)."""
    key = "blocked_s" if "blocked_s" in e or "blocked_s" in into else "seconds"
    if key == "blocked_s" and "seconds" in into and "blocked_s" not in into:
        into["blocked_s"] = into.pop("seconds")
    cost = max(_num(e.get("blocked_s", e.get("seconds"))) or 0.0, 0.0)
    into[key] = (_num(into.get(key)) or 0.0) + cost
    for field in ("step", "time"):
        value, old = _num(e.get(field)), _num(into.get(field))
        if value is not None and (old is None or old < value):
            into[field] = e[field]


def _plus(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else a + b


class _Merged:
    """One rank's step summaries of one attempt as one: the sums added, the spans widened
    (the fields the goodput planner reads of them; ``None``: no summary had the field)."""

    __slots__ = ("attempt", "rank", "step_time_sum_s", "intervals", "reports", "replay_time_s",
                 "replay_steps", "optimizer_steps", "replay_optimizer_steps", "first_time",
                 "begin_time", "first_step", "last_step",
                 "last_time", "time")

    def __init__(self, attempt: Any, rank: int) -> None:
        self.attempt, self.rank = attempt, rank
        self.step_time_sum_s = self.intervals = self.reports = None
        self.replay_time_s = self.replay_steps = None
        self.optimizer_steps = self.replay_optimizer_steps = None
        self.first_time = self.begin_time = self.first_step = None
        self.last_step = self.last_time = self.time = None

    def add(self, s: Any) -> None:
        """One summary (:class:`~rayguard.events.summary.StepSummary` or a ``StepLine``), or
        another merged one of the same rank and attempt. (Written out, not looped over
        the fields: it runs once per summary of a long log.)"""
        v = s.step_time_sum_s
        if v is not None:
            self.step_time_sum_s = v if self.step_time_sum_s is None else self.step_time_sum_s + v
        v = s.intervals
        if v is not None:
            self.intervals = v if self.intervals is None else self.intervals + v
        v = s.reports
        if v is not None:
            self.reports = v if self.reports is None else self.reports + v
        if s.replay_steps is not None or s.replay_time_s is not None:
            self.replay_time_s = _plus(self.replay_time_s, s.replay_time_s)
            self.replay_steps = _plus(self.replay_steps, s.replay_steps)
        if s.optimizer_steps is not None or s.replay_optimizer_steps is not None:
            self.optimizer_steps = _plus(self.optimizer_steps, s.optimizer_steps)
            self.replay_optimizer_steps = _plus(self.replay_optimizer_steps,
                                                s.replay_optimizer_steps)
        v = s.first_time or s.time
        if v is not None and (self.first_time is None or v < self.first_time):
            self.first_time = v
        v = s.begin_time
        if v is not None and (self.begin_time is None or v < self.begin_time):
            self.begin_time = v
        v = s.first_step
        if v is not None and (self.first_step is None or v < self.first_step):
            self.first_step = v
        v = s.last_step
        if v is not None and (self.last_step is None or v > self.last_step):
            self.last_step = v
        v = s.last_time
        if v is not None and (self.last_time is None or v > self.last_time):
            self.last_time = v
        v = s.time
        if v is not None and (self.time is None or v > self.time):
            self.time = v

    def event(self) -> dict[str, Any]:
        out = {"kind": "steps", "attempt": self.attempt, "rank": self.rank}
        out.update((name, value) for name in self.__slots__[2:]
                   if (value := getattr(self, name)) is not None)
        return out


class CompactLog:
    """What :func:`~rayguard.observe.goodput.goodput` reads of a log: per attempt, the
    earliest event of each kind, the lead (lowest) rank's step summaries merged into one,
    one merged commit, the attempt's first event and the highest step it reached; and the
    run's last event. Step summaries come as dicts (:meth:`add`) or typed
    (:meth:`add_steps`)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._steps: dict[Any, _Merged] = {}  # per attempt: its lead rank's summaries
        self._unranked: dict[Any, float] = {}  # per attempt: a summary with no rank, when
        self._first: dict[Any, float] = {}  # per attempt: its first event's time
        self._reached: dict[Any, list[Any]] = {}  # per attempt: [highest step, time seen]
        self._last: tuple[float, Any] | None = None  # the run's last event: (time, kind)

    def __len__(self) -> int:
        return (len(self._kept) + len(self._steps) + len(self._unranked) + len(self._first)
                + len(self._reached) + (self._last is not None))

    def add(self, event: dict[str, Any]) -> None:
        t = _num(event.get("time"))
        if t is None:
            return
        if event.get("kind") == "steps":
            self.add_steps(StepSummary(event))
            return
        e = {k: v for k, v in event.items() if k not in _DROP}
        kind, attempt = e.get("kind"), e.get("attempt")
        if type(attempt) is not int:  # the planner groups by int attempts only (a crafted
            attempt = None  # log's [] or true must neither crash nor pass for attempt 1)
        if not isinstance(kind, str):
            kind = str(kind)
        if self._last is None or t >= self._last[0]:
            self._last = (t, kind)
        if kind == "checkpoint_committed":
            _merge_commit(self._kept.setdefault(("commit", attempt), {
                "kind": kind, "attempt": attempt}), e)
        else:
            old = self._kept.get((kind, attempt))
            if old is None or t < old["time"]:
                self._kept[(kind, attempt)] = e
        step = e.get("last_step", e.get("step"))
        self._mark(attempt, t, step if kind not in ("restored", "start") else None)

    def add_steps(self, s: Any) -> None:
        """One step summary (:class:`~rayguard.events.summary.StepSummary` or a
        :class:`~rayguard.events.fast.StepLine`)."""
        t = s.time
        if t is None:
            return
        attempt, rank = s.attempt, s.rank
        last = self._last
        if last is None or t >= last[0]:
            self._last = (t, "steps")
        if rank is None:
            self._unranked[attempt] = max(t, self._unranked.get(attempt, t))
        else:
            merged = self._steps.get(attempt)
            if merged is None or rank < merged.rank:
                merged = self._steps[attempt] = _Merged(attempt, rank)
            if rank == merged.rank:
                merged.add(s)
        if attempt is None:
            return
        first = self._first.get(attempt)  # _mark, written out
        if first is None or t < first:
            self._first[attempt] = t
        step = s.reach
        if step is not None:
            top = self._reached.get(attempt)
            if top is None:
                self._reached[attempt] = [step, t]
            elif step > top[0]:
                top[0] = step

    def _mark(self, attempt: Any, t: float, step: Any) -> None:
        """The attempt's first event (its start when it did not fail) and highest step."""
        if attempt is None:
            return
        first = self._first.get(attempt)
        if first is None or t < first:
            self._first[attempt] = t
        if integer(step) is not None:
            top = self._reached.get(attempt)
            if top is None:
                self._reached[attempt] = [step, t]
            elif step > top[0]:
                top[0] = step

    def merge(self, later: CompactLog) -> None:
        """Add what ``later`` kept of the log's next part (read apart, in parallel)."""
        for key, e in later._kept.items():
            mine = self._kept.get(key)
            if mine is None:
                self._kept[key] = e
            elif key[0] == "commit":
                _merge_commit(mine, e)
            elif e["time"] < mine["time"]:
                self._kept[key] = e
        for attempt, merged in later._steps.items():
            mine_steps = self._steps.get(attempt)
            if mine_steps is None or merged.rank < mine_steps.rank:
                self._steps[attempt] = merged
            elif merged.rank == mine_steps.rank:
                mine_steps.add(merged)
        for attempt, t in later._unranked.items():
            self._unranked[attempt] = max(t, self._unranked.get(attempt, t))
        for attempt, t in later._first.items():
            self._first[attempt] = min(t, self._first.get(attempt, t))
        for attempt, (step, t) in later._reached.items():
            self._mark(attempt, t, step)
        if later._last is not None and (self._last is None or later._last[0] >= self._last[0]):
            self._last = later._last

    def events(self) -> list[dict[str, Any]]:
        out = list(self._kept.values())
        for attempt, t in self._first.items():
            out.append({"kind": "_first", "attempt": attempt, "time": t})
        for attempt, (step, t) in self._reached.items():
            out.append({"kind": "_reached", "attempt": attempt, "step": step, "time": t})
        out.extend(m.event() for m in self._steps.values())
        out.extend({"kind": "steps", "attempt": a, "rank": None, "time": t}
                   for a, t in self._unranked.items())
        if self._last is not None:
            t, kind = self._last
            out.append({"kind": kind if kind in ("finished", "failed") else "_last", "time": t})
        return out
