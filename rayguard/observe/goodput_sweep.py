"""Goodput per trial of a sweep, from the sweep's log (pure, no Ray).

The sweep log knows less than a run log: when a trial started, when a health check judged
it unhealthy (a stall's verdict says how long it went without a result), when it was
restarted and when it ended. So a trial's figures have ``restart`` (``detection``: the
verdict to the restart; ``worker_start``: the restart to the trial running again) and
``stall``; start-up, replayed iterations and checkpoint time are not in the sweep log and
count as productive (:attr:`Goodput.not_measured` says so): the ratio is an upper bound. A
trial run by :class:`rayguard.RobustTrainer` has its own run log with the whole picture.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rayguard.events.fields import event_time as _t
from rayguard.observe.goodput import CAUSES, RESTART_PHASES, Goodput

_NOT_MEASURED = ("start-up, replayed iterations and checkpoint time (not in a sweep log): "
                 "counted as productive, so the ratio is an upper bound",)


def _stall_s(unhealthy: dict[str, Any] | None) -> float:
    verdict = unhealthy.get("verdict") if unhealthy else None
    if not isinstance(verdict, dict) or verdict.get("check") != "stall":
        return 0.0
    value = verdict.get("value")
    return max(float(value), 0.0) if isinstance(value, (int, float)) else 0.0


def _trial(evs: list[dict[str, Any]]) -> Goodput:
    t0 = next((_t(e) for e in evs if e.get("kind") == "trial_started"), _t(evs[0])) or 0.0
    t_end = _t(evs[-1]) or t0
    now, productive = t0, 0.0
    badput, phases = dict.fromkeys(CAUSES, 0.0), dict.fromkeys(RESTART_PHASES, 0.0)

    def take(until: float | None) -> float:
        nonlocal now
        if until is None or until <= now:
            return 0.0
        spent, now = until - now, until
        return spent

    unhealthy: dict[str, Any] | None = None
    restarts = 0
    waiting = False  # restarted, not yet running again
    for e in evs:
        kind, t = e.get("kind"), _t(e)
        if kind == "unhealthy" and not waiting:
            unhealthy = e
        elif kind == "restart":
            seen = _t(unhealthy) if unhealthy is not None else t
            stall = min(_stall_s(unhealthy), max((seen or now) - now, 0.0))
            productive += take((seen or now) - stall)
            badput["stall"] += take(seen)
            phases["detection"] += take(t)
            unhealthy, waiting, restarts = None, True, restarts + 1
        elif kind == "trial_started" and waiting:
            phases["worker_start"] += take(t)
            waiting = False
    if waiting:
        phases["worker_start"] += take(t_end)
    productive += take(t_end)
    badput["restart"] = sum(phases.values())
    wall = t_end - t0
    return Goodput(wall, productive, productive / wall if wall > 0 else None, badput, phases,
                   not_measured=_NOT_MEASURED, restarts=restarts)


def sweep_goodput(events: Iterable[dict[str, Any]]) -> dict[str, Goodput]:
    """Each trial's goodput (by trial id), from a sweep log's events (any order)."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted((e for e in events if _t(e) is not None), key=lambda e: _t(e) or 0.0):
        if e.get("trial_id"):
            by[str(e["trial_id"])].append(e)
    return {trial: _trial(evs) for trial, evs in by.items()}


def format_sweep_goodput(trials: dict[str, Goodput]) -> str:
    """One row per trial: wall time, goodput, restart and stall seconds, restarts."""
    lines = [f"{'trial':<24}{'wall_s':>10}{'goodput':>9}{'restart_s':>11}{'stall_s':>9}"
             f"{'restarts':>9}"]
    for trial, g in trials.items():
        ratio = "-" if g.ratio is None else f"{g.ratio:.2f}"
        lines.append(f"{trial:<24}{g.wall_s:>10.1f}{ratio:>9}{g.badput_s['restart']:>11.1f}"
                     f"{g.badput_s['stall']:>9.1f}{g.restarts:>9}")
    lines.append("not measured: " + _NOT_MEASURED[0])
    return "\n".join(lines)
