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

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from rayguard.events.fields import event_time
from rayguard.events.fields import integer as _int
from rayguard.events.fields import number as _number
from rayguard.observe.causes import FAILURE_KINDS, failure_cause
from rayguard.observe.table import one_line
from rayguard.observe.thinning import MAX_POINTS, thin

if TYPE_CHECKING:
    from rayguard.observe.digest import LogDigest

__all__ = ["FAULT_KINDS", "MAX_POINTS", "build_run", "build_run_digest", "build_sweep", "thin"]

FAULT_KINDS = {"worker_died": "died", "stall_detected": "hang", "nan_detected": "nan",
               "diverged": "nan",
               "preflight_error": "preflight", "straggler": "straggler", "crash_loop": "crash_loop",
               "fault_injected": "injected", "hang_diagnosed": "culprit"}


def _t(event: dict[str, Any]) -> float:
    return event_time(event) or 0.0


def build_run(events: list[dict[str, Any]], metric: str | None = None) -> dict[str, Any]:
    """The report's data for a run's events (unknown kinds are ignored)."""
    from rayguard.observe.digest import LogDigest

    return build_run_digest(LogDigest.of(events, metric), metric)


def build_run_digest(digest: LogDigest, metric: str | None = None) -> dict[str, Any]:
    """The report's data from a digest of the run's log (:mod:`rayguard.observe.digest`):
    step summaries are read from its curves and figures, every other event from its
    events."""
    events, series = digest.events(), digest.series
    if series is None:
        raise ValueError("build_run_digest needs a digest with curves (LogDigest(curves=True))")
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
    attempts = _attempts(events, by_attempt, t0)
    restarts = _restarts(events, by_attempt, series.reached, t0)
    data = {
        "kind": "run", "empty": False, "t0": t0, "attempts": attempts, "restarts": restarts,
        "checkpoints": _checkpoints(events, t0), "faults": _faults(events, t0),
        "world_size": [[a["start"], a["world_size"]] for a in attempts if a["world_size"]],
        "throughput": series.throughput(t0),
        "metric": series.metric(metric or series.metric_name()), "counts": digest.counts(),
    }
    data["summary"] = _summary(events, data, series.mean_step_s(), t0)
    return data


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


def _reached(evs: list[dict[str, Any]], summaries: int | None) -> int | None:
    """The highest step an attempt is known to have reached (its step summaries:
    ``summaries``; checkpoints, failure events). Steps reported after the last summary of a
    killed rank are not known, so replayed steps are a lower bound."""
    candidates = [_int(e.get("last_step")) for e in evs if e.get("kind") == "steps"]
    candidates += [_int(e.get("step")) for e in evs if e.get("kind") != "restored"]
    found = [c for c in [*candidates, summaries] if c is not None]
    return max(found) if found else None


def _restarts(events, by_attempt, reached_by_attempt, t0) -> list[dict[str, Any]]:
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
        reached = _reached(failed, reached_by_attempt.get(a) if a is not None else None)
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


def _summary(events, data, mean_step, t0) -> dict[str, Any]:
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


def _counts(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for e in events:
        out[str(e.get("kind"))] += 1
    return dict(out)
