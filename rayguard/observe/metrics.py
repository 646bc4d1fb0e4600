"""rayguard's metrics, through Ray's own metrics system (``ray.util.metrics``).

They appear on Ray's Prometheus endpoint next to ``ray_train_*``; Ray prefixes every
application metric with ``ray_`` and adds ``_total`` to counters, so ``restarts`` below is
scraped as ``ray_rayguard_restarts_total``. Every series has a ``run`` label (the run
directory's name).

:func:`event_updates` and :func:`summary_updates` are pure (events in, :class:`Update` out);
:class:`RayMetrics` applies updates in the process that owns the metrics (the run's
coordinator actor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFIX = "rayguard_"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    """Name given to Ray (without ``ray_``; counters without ``_total``)."""
    type: str
    """``counter``, ``gauge`` or ``histogram``."""
    help: str
    tags: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()

    @property
    def exported(self) -> str:
        """The name on Ray's Prometheus endpoint."""
        return f"ray_{self.name}" + ("_total" if self.type == "counter" else "")


_SECONDS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

SPECS: dict[str, MetricSpec] = {s.name: s for s in (
    MetricSpec(PREFIX + "restarts", "counter", "Worker-group restarts, by cause", ("cause",)),
    MetricSpec(PREFIX + "stalls", "counter", "Stalls (hangs) detected by the progress watchdog"),
    MetricSpec(PREFIX + "nan_events", "counter", "Watched metrics found NaN/inf"),
    MetricSpec(PREFIX + "checkpoints_committed", "counter", "Checkpoints committed and verified"),
    MetricSpec(PREFIX + "checkpoints_rejected", "counter", "Checkpoints rejected at restore"),
    MetricSpec(PREFIX + "checkpoint_fallbacks", "counter",
               "Restores that fell back to an older checkpoint"),
    MetricSpec(PREFIX + "checkpoint_bytes", "counter", "Bytes written in committed checkpoints"),
    MetricSpec(PREFIX + "checkpoint_seconds", "histogram",
               "Seconds per checkpoint: phase=blocked (the loop waited) or total", ("phase",),
               _SECONDS),
    MetricSpec(PREFIX + "stragglers", "counter", "Ranks flagged as stragglers", ("rank",)),
    MetricSpec(PREFIX + "report_latency_seconds", "gauge",
               "Mean seconds a report call blocked the loop, per rank", ("rank",)),
    MetricSpec(PREFIX + "step_time_seconds", "gauge",
               "Mean step time (between reports) per rank", ("rank",)),
    MetricSpec(PREFIX + "straggler_score", "gauge",
               "Rank's mean step time / peers' median over the straggler window", ("rank",)),
    MetricSpec(PREFIX + "world_size", "gauge", "Workers in the current attempt"),
    MetricSpec(PREFIX + "attempt", "gauge", "Current attempt (0: first start)"),
    MetricSpec(PREFIX + "goodput_ratio", "gauge",
               "Productive time (new steps) / wall time of the run so far (ETTR)"),
    MetricSpec(PREFIX + "quarantined_nodes", "gauge",
               "Nodes the run leaves out of its worker groups (quarantined)"),
    MetricSpec(PREFIX + "badput_seconds", "counter",
               "Seconds of the run's wall time not spent on new steps, by cause", ("cause",)),
)}


@dataclass(frozen=True)
class Update:
    name: str
    value: float
    tags: tuple[tuple[str, str], ...] = ()


def _u(name: str, value: float = 1.0, **tags: Any) -> Update:
    return Update(PREFIX + name, float(value), tuple(sorted((k, str(v)) for k, v in tags.items())))


def event_updates(event: dict[str, Any]) -> list[Update]:
    """The metric updates one event implies (``restart`` events carry their ``cause``;
    ``restored`` events their ``fallback`` flag, both added by the observer)."""
    kind = event.get("kind")
    if kind == "restart":
        return [_u("restarts", cause=event.get("cause") or "unknown")]
    if kind == "stall_detected":
        return [_u("stalls")]
    if kind in ("nan_detected", "diverged"):
        return [_u("nan_events")]
    if kind == "checkpoint_rejected":
        return [_u("checkpoints_rejected")]
    if kind == "restored" and event.get("fallback"):
        return [_u("checkpoint_fallbacks")]
    if kind == "attempt_started":
        out = [_u("attempt", event.get("attempt") or 0)]
        if isinstance(event.get("world_size"), int):
            out.append(_u("world_size", event["world_size"]))
        return out
    if kind == "straggler":
        return [_u("stragglers", rank=event.get("rank"))]
    if kind in ("node_quarantined", "quarantine_lifted"):
        count = event.get("quarantined_nodes")
        return [_u("quarantined_nodes", count)] if isinstance(count, int) else []
    if kind == "checkpoint_committed":
        out = [_u("checkpoints_committed")]
        if isinstance(event.get("bytes"), (int, float)):
            out.append(_u("checkpoint_bytes", event["bytes"]))
        seconds, blocked = event.get("seconds"), event.get("blocked_s", event.get("seconds"))
        if isinstance(blocked, (int, float)):  # the loop blocked (async: snapshot, back-pressure)
            out.append(_u("checkpoint_seconds", blocked, phase="blocked"))
        if isinstance(seconds, (int, float)):  # the save to its commit
            out.append(_u("checkpoint_seconds", seconds, phase="total"))
        return out
    return []


def summary_updates(rank: int, summary: dict[str, Any], score: float | None) -> list[Update]:
    """Gauges from one rank's step summary (and its current straggler score)."""
    out = []
    if summary.get("intervals"):
        out.append(_u("step_time_seconds", summary["step_time_sum_s"] / summary["intervals"],
                      rank=rank))
    if summary.get("reports"):
        out.append(_u("report_latency_seconds", summary["blocked_sum_s"] / summary["reports"],
                      rank=rank))
    if score is not None:
        out.append(_u("straggler_score", score, rank=rank))
    return out


class RayMetrics:
    """Applies updates with ``ray.util.metrics`` (created on first use, in this process)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self._metrics: dict[str, Any] = {}

    def _metric(self, spec: MetricSpec) -> Any:
        metric = self._metrics.get(spec.name)
        if metric is None:
            from ray.util import metrics as rm

            tags = ("run", *spec.tags)
            if spec.type == "counter":
                metric = rm.Counter(spec.name, spec.help, tag_keys=tags)
            elif spec.type == "gauge":
                metric = rm.Gauge(spec.name, spec.help, tag_keys=tags)
            else:
                metric = rm.Histogram(spec.name, spec.help, boundaries=list(spec.boundaries),
                                      tag_keys=tags)
            self._metrics[spec.name] = metric
        return metric

    def apply(self, updates: list[Update]) -> None:
        for update in updates:
            spec = SPECS[update.name]
            if spec.type == "counter" and update.value <= 0:
                continue  # nothing to add (an empty checkpoint's bytes): Ray refuses 0
            metric = self._metric(spec)
            tags = {"run": self.run, **dict(update.tags)}
            if spec.type == "counter":
                metric.inc(update.value, tags=tags)
            elif spec.type == "gauge":
                metric.set(update.value, tags=tags)
            else:
                metric.observe(update.value, tags=tags)


def goodput_updates(ratio: float | None, badput_s: dict[str, float],
                    published: dict[str, float]) -> list[Update]:
    """The goodput gauge and the badput counters' increments since ``published`` (what was
    counted so far, by cause; updated here). A cause's figure can shrink as the run goes on
    (a stall is known only when detected): a counter only grows, so it waits until the
    figure passes what it already counted."""
    out = [] if ratio is None else [_u("goodput_ratio", ratio)]
    for cause, seconds in badput_s.items():
        delta = seconds - published.get(cause, 0.0)
        if delta > 1e-9:
            out.append(_u("badput_seconds", delta, cause=cause))
            published[cause] = seconds
    return out
