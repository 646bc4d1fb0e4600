"""What happened in a run, as plain data (pure): attempts, restarts with cause and cost,
checkpoints, faults, world size and steps/s over time, a metric over steps, and the summary
figures. :mod:`rayguard.observe.report` draws it; the same dict is embedded in the page.

Times are seconds since the first event. A restart's *cost* is the time from the failure
(the first failure event of the attempt that failed) to the first step reported after the
restart; *replayed steps* are the steps done again because the run went back to a
checkpoint. Time lost to failures = detection (stall timeout of a hang) + cost + replayed
steps x the mean step time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from rayguard.observe.causes import FAILURE_KINDS, failure_cause
from rayguard.observe.table import one_line

MAX_POINTS = 4000
"""Points per curve in the report (longer series are thinned evenly, keeping the ends): a
week-long run draws as fast as a short one."""

FAULT_KINDS = {"worker_died": "died", "stall_detected": "hang", "nan_detected": "nan",
               "diverged": "nan",
               "preflight_error": "preflight", "straggler": "straggler", "crash_loop": "crash_loop",
               "fault_injected": "injected", "hang_diagnosed": "culprit"}


def _t(event: dict[str, Any]) -> float:
    value = event.get("time")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A number field of a record, or None when the record holds something else there."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def build_run(events: list[dict[str, Any]], metric: str | None = None) -> dict[str, Any]:
    """The report's data for a run's events (oldest first; unknown kinds are ignored)."""
    if not events:
        return {"kind": "run", "empty": True, "summary": {}, "attempts": [], "restarts": [],
                "checkpoints": [], "faults": [], "world_size": [], "throughput": [],
                "metric": {"name": metric, "series": []}, "counts": {}}
    t0 = _t(events[0])
    by_attempt: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        a = _int(e.get("attempt"))
        if a is not None:
            by_attempt[a].append(e)
    steps = [e for e in events if e.get("kind") == "steps"]
    metric = metric or next((e["metric"] for e in steps
                             if isinstance(e.get("metric"), str) and e["metric"]), None) or "loss"
    attempts = _attempts(events, by_attempt, t0)
    restarts = _restarts(events, by_attempt, steps, t0)
    checkpoints = _checkpoints(events, t0)
    data = {
        "kind": "run", "empty": False, "t0": t0, "attempts": attempts, "restarts": restarts,
        "checkpoints": checkpoints, "faults": _faults(events, t0),
        "world_size": [[a["start"], a["world_size"]] for a in attempts if a["world_size"]],
        "throughput": _throughput(steps, t0), "metric": _metric(steps, metric),
        "counts": _counts(events),
    }
    data["summary"] = _summary(events, data, steps, t0)
    return data


def thin(points: list[Any], max_points: int = MAX_POINTS) -> list[Any]:
    """Every k-th point so that at most ``max_points`` remain (the last one is kept)."""
    if len(points) <= max_points:
        return points
    stride = -(-len(points) // max_points)
    out = points[::stride]
    if out[-1] is not points[-1]:
        out.append(points[-1])
    return out


def _counts(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for e in events:
        out[str(e.get("kind"))] += 1
    return dict(out)


def _attempts(events, by_attempt, t0) -> list[dict[str, Any]]:
    end_of_run = _t(events[-1]) - t0
    out = []
    numbers = sorted(by_attempt)
    for i, a in enumerate(numbers):
        evs = by_attempt[a]
        started = next((e for e in evs if e.get("kind") == "attempt_started"), evs[0])
        failure = next((e for e in evs if e.get("kind") in FAILURE_KINDS + ("restart",)), None)
        finished = next((e for e in evs if e.get("kind") in ("finished", "failed")), None)
        if failure is not None:
            end, outcome = _t(failure) - t0, "failed"
        elif finished is not None:
            end, outcome = _t(finished) - t0, str(finished.get("kind"))
        elif i + 1 < len(numbers):
            end, outcome = _t(by_attempt[numbers[i + 1]][0]) - t0, "ended"
        else:
            end, outcome = end_of_run, "running"
        start = _t(started) - t0
        out.append({"attempt": a, "start": start, "end": max(end, start),
                    "world_size": _int(started.get("world_size")), "outcome": outcome})
    return out


def _reached(evs: list[dict[str, Any]]) -> int | None:
    """The highest step an attempt is known to have reached (step summaries, checkpoints,
    failure events). Steps reported after the last summary of a killed rank are not known,
    so replayed steps are a lower bound."""
    candidates = [_int(e.get("last_step")) for e in evs if e.get("kind") == "steps"]
    candidates += [_int(e.get("step")) for e in evs if e.get("kind") != "restored"]
    found = [c for c in candidates if c is not None]
    return max(found) if found else None


def _restarts(events, by_attempt, steps, t0) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e.get("kind") != "restart":
            continue
        a = _int(e.get("attempt"))
        failed = by_attempt.get(a, []) if a is not None else []
        failures = [f for f in failed if f.get("kind") in FAILURE_KINDS]
        failure_t = _t(failures[0]) if failures else _t(e)
        nxt = by_attempt.get(a + 1, []) if a is not None else []
        first_steps = [s for s in nxt if s.get("kind") == "steps"]
        resumed = (_number(first_steps[0].get("first_time")) or _t(first_steps[0])
                   if first_steps else None)
        restored = next((r for r in nxt if r.get("kind") == "restored"), None)
        restored_step = _int(restored.get("step")) if restored else None
        reached = _reached(failed)
        # steps done again = from the first step the next attempt reported up to the highest
        # step the failed one is known to have reached
        restart_step = _int(first_steps[0].get("first_step")) if first_steps else None
        if restart_step is None and restored_step is not None:
            restart_step = restored_step + 1
        replayed = 0
        if reached is not None and restart_step is not None:
            replayed = reached - restart_step + 1
        stall = next((f for f in failures if f.get("kind") == "stall_detected"), None)
        detection = stall.get("timeout_s") if stall else None
        out.append({
            "attempt": a, "time": _t(e) - t0, "failure_time": failure_t - t0,
            "cause": str(e.get("cause") or failure_cause(failed)),
            "resumed_time": None if resumed is None else float(resumed) - t0,
            "cost_s": None if resumed is None else max(float(resumed) - failure_t, 0.0),
            "detection_s": float(detection) if isinstance(detection, (int, float)) else 0.0,
            "restored_step": restored_step, "reached_step": reached,
            "replayed_steps": max(replayed, 0),
            "fallback": bool(restored.get("fallback")) if restored else False,
        })
    return out


def _checkpoints(events, t0) -> list[dict[str, Any]]:
    status = {"checkpoint_committed": "committed", "checkpoint_rejected": "rejected",
              "restored": "restored"}
    out = []
    for e in events:
        kind = e.get("kind")
        if kind not in status:
            continue
        s = status[kind]
        if kind == "restored" and e.get("fallback"):
            s = "fallback"
        out.append({"time": _t(e) - t0, "status": s, "step": _int(e.get("step")),
                    "attempt": _int(e.get("attempt")), "path": e.get("path"),
                    "bytes": _int(e.get("bytes")), "seconds": _number(e.get("seconds")),
                    # async checkpoints: the loop was blocked only for blocked_s
                    "blocked_s": _number(e.get("blocked_s", e.get("seconds"))),
                    "backpressure_s": _number(e.get("backpressure_s", 0.0)),
                    "detail": one_line(e.get("detail"))})
    return out


def _faults(events, t0) -> list[dict[str, Any]]:
    out = []
    for e in events:
        kind = e.get("kind")
        if kind not in FAULT_KINDS:
            continue
        out.append({"time": _t(e) - t0, "kind": FAULT_KINDS[str(kind)], "event": kind,
                    "rank": _int(e.get("rank")), "node": e.get("node"), "step": _int(e.get("step")),
                    "attempt": _int(e.get("attempt")), "stacks": _stacks(e),
                    "detail": one_line(e.get("detail"), 300)})
    return out


def _stacks(event: dict[str, Any]) -> Any:
    """A fault's stack dump; a diagnosed hang's: ``{rank: file}`` of its culprits."""
    stacks = event.get("stacks")
    if event.get("kind") != "hang_diagnosed" or not isinstance(stacks, dict):
        return stacks
    culprits = {str(r) for r in event.get("culprits") or []}
    return {str(r): str(p) for r, p in stacks.items() if str(r) in culprits and p}


def _lead_rank(steps: list[dict[str, Any]]) -> dict[int, int]:
    """Per attempt, the lowest rank that sent summaries (its curve stands for the run)."""
    lead: dict[int, int] = {}
    for s in steps:
        a, r = _int(s.get("attempt")), _int(s.get("rank"))
        if a is not None and r is not None and (a not in lead or r < lead[a]):
            lead[a] = r
    return lead


def _throughput(steps, t0) -> list[dict[str, Any]]:
    lead = _lead_rank(steps)
    prev: dict[int, tuple[float, int]] = {}
    out = []
    for s in steps:
        a = _int(s.get("attempt"))
        if a is None or _int(s.get("rank")) != lead.get(a) or _int(s.get("last_step")) is None:
            continue
        t, last = _t(s), int(s["last_step"])
        if a in prev and t > prev[a][0]:
            out.append({"time": t - t0, "attempt": a,
                        "steps_per_s": max(last - prev[a][1], 0) / (t - prev[a][0])})
        prev[a] = (t, last)
    return thin(out)


def _metric(steps, name) -> dict[str, Any]:
    lead = _lead_rank(steps)
    series: dict[int, list[Any]] = defaultdict(list)
    for s in steps:
        a = _int(s.get("attempt"))
        samples = s.get("samples")
        if (a is None or not samples or _int(s.get("rank")) != lead.get(a)
                or s.get("metric") != name or not isinstance(samples, list)):
            continue
        series[a].extend(samples)
    total = sum(len(p) for p in series.values()) or 1
    out = []
    for a, pts in sorted(series.items()):
        kept = thin(pts, max(200, MAX_POINTS * len(pts) // total))
        out.append({"attempt": a, "points": [
            [p[0], _number(p[1])] for p in kept
            if isinstance(p, (list, tuple)) and len(p) == 2 and _number(p[0]) is not None]})
    return {"name": name, "series": out}


def _summary(events, data, steps, t0) -> dict[str, Any]:
    step_means = [float(s["step_time_sum_s"]) / s["intervals"] for s in steps
                  if _int(s.get("intervals")) is not None and s["intervals"] > 0
                  and _number(s.get("step_time_sum_s")) is not None]
    mean_step = statistics.fmean(step_means) if step_means else 0.0
    restarts = data["restarts"]
    replayed = sum(r["replayed_steps"] for r in restarts)
    lost = sum((r["cost_s"] or 0.0) + r["detection_s"] for r in restarts) + replayed * mean_step
    committed = [c for c in data["checkpoints"] if c["status"] == "committed"]
    causes: dict[str, int] = defaultdict(int)
    for r in restarts:
        causes[str(r["cause"])] += 1
    last = events[-1].get("kind")
    return {
        "wall_s": _t(events[-1]) - t0,
        "outcome": last if last in ("finished", "failed") else "running or cut short",
        "attempts": len(data["attempts"]), "restarts": len(restarts),
        "restarts_by_cause": dict(causes),
        "time_lost_s": lost, "replayed_steps": replayed, "mean_step_s": mean_step,
        "checkpoints_committed": len(committed),
        "checkpoint_blocked_s": sum(float(c["blocked_s"] or 0.0) for c in committed),
        "checkpoint_backpressure_s": sum(float(c["backpressure_s"] or 0.0) for c in committed),
        "checkpoint_bytes": sum(int(c["bytes"] or 0) for c in committed),
        "checkpoints_rejected": sum(1 for c in data["checkpoints"] if c["status"] == "rejected"),
        "fallbacks": sum(1 for c in data["checkpoints"] if c["status"] == "fallback"),
        "stragglers": sum(1 for f in data["faults"] if f["kind"] == "straggler"),
        "stalls": sum(1 for f in data["faults"] if f["kind"] == "hang"),
        "nan_events": sum(1 for f in data["faults"] if f["kind"] == "nan"),
    }


def build_sweep(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per trial: final state, health verdicts and restarts."""
    t0 = _t(events[0]) if events else 0.0
    trials: dict[str, dict[str, Any]] = {}
    for e in events:
        trial = e.get("trial_id")
        if not trial:
            continue
        row = trials.setdefault(str(trial), {"trial_id": str(trial), "state": "running",
                                             "verdicts": [], "restarts": 0, "started": _t(e) - t0})
        kind = e.get("kind")
        if kind == "unhealthy":
            raw = e.get("verdict")
            verdict: dict[str, Any] = raw if isinstance(raw, dict) else {}
            row["verdicts"].append({"check": verdict.get("check"), "detail": one_line(e.get("detail"))})
        elif kind == "restart":
            row["restarts"] += 1
        elif kind in ("trial_completed", "trial_errored", "failed"):
            row["state"] = {"trial_completed": "completed", "trial_errored": "errored"}.get(
                str(kind), "failed")
    return {"kind": "sweep", "t0": t0, "wall_s": (_t(events[-1]) - t0) if events else 0.0,
            "trials": sorted(trials.values(), key=lambda r: r["started"]), "counts": _counts(events)}
