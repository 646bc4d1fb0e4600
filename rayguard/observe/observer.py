"""RunObserver: the observability adapter inside the run's coordinator actor.

Every event the coordinator records passes through it: a ``restart`` gets its ``cause``
(from the failed attempt's events), a ``restored`` its ``fallback`` flag, and each event
becomes metric updates (the run's goodput among them, :mod:`rayguard.observe.goodput_meter`). Step summaries from the ranks become ``steps`` events, gauges and,
through the straggler rule, ``straggler`` events. A metrics failure is logged, never raised:
observing must not break the run.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rayguard.events import make_event
from rayguard.observe.causes import FAILURE_KINDS, failure_cause, hang_culprits
from rayguard.observe.goodput_meter import GoodputMeter
from rayguard.observe.metrics import RayMetrics, Update, event_updates, summary_updates
from rayguard.observe.straggler import StragglerDetector, describe, verdict_fields

logger = logging.getLogger("rayguard")

JUDGE_EVERY_S = 1.0
"""How often the straggler rule is judged once the run has :data:`JUDGE_ALWAYS_BELOW` ranks
or more (each judgement is O(N log N); a 16,384-rank run's nodes send 2,048 batches a
second). Smaller runs are judged on every summary, as before."""
JUDGE_ALWAYS_BELOW = 64


class RunObserver:
    def __init__(self, run: str, *, straggler_threshold: float | None = 1.5,
                 straggler_window_s: float = 60.0, metrics: Any = "ray") -> None:
        self.metrics = RayMetrics(run) if metrics == "ray" else metrics
        self.detector = StragglerDetector(straggler_threshold, straggler_window_s)
        self._failures: dict[int, list[dict[str, Any]]] = {}
        self._rejected_since_restore = 0
        self._lock = threading.Lock()
        self.goodput = GoodputMeter()
        self._scores: dict[int, float] = {}
        self._judged = float("-inf")

    # -- events ----------------------------------------------------------------------------
    def annotate(self, event: dict[str, Any]) -> None:
        """Add what only the whole run knows, before the event is written."""
        kind = event.get("kind")
        with self._lock:
            attempt = event.get("attempt")
            if kind in FAILURE_KINDS and isinstance(attempt, int):
                self._failures.setdefault(attempt, []).append(event)
            elif kind == "restart" and "cause" not in event:
                failed = self._failures.get(attempt, [])  # type: ignore[arg-type]
                event["cause"] = failure_cause(failed)
                hang = hang_culprits(failed)  # a diagnosed hang: the restart names the culprits
                if hang is not None:
                    event.update(hang)
                    event["detail"] = f"{event.get('detail', '')} (hang: {hang['cause_detail']})"
            elif kind == "checkpoint_rejected":
                self._rejected_since_restore += 1
            elif kind == "restored":
                event.setdefault("fallback", self._rejected_since_restore > 0)
                self._rejected_since_restore = 0

    def emit(self, event: dict[str, Any]) -> None:
        self._apply(event_updates(event))
        try:
            with self._lock:
                updates = self.goodput.on_event(event)
        except Exception as exc:  # observing must never break the run
            logger.warning("rayguard: could not compute goodput: %s", exc)
            return
        self._apply(updates)

    # -- step summaries ----------------------------------------------------------------------
    def on_summaries(self, batch: list[dict[str, Any]], *, merge: bool = False
                     ) -> list[dict[str, Any]]:
        """The events of several ranks' summaries (a node's, sent together by its agent):
        the straggler rule judged once for the batch, a ``steps`` event per summary; with
        ``merge``, one for the batch: its lowest rank's, naming every rank it stands for
        (``ranks``) and their furthest step (``ranks_last_step``), so that a large run's log
        grows with nodes, not ranks (the goodput planner reads the lowest rank's)."""
        if not batch:
            return []
        now = max(float(s.get("time") or time.time()) for s in batch)
        with self._lock:
            for summary in batch:
                self.detector.add(
                    rank=int(summary.get("rank", -1)), attempt=int(summary.get("attempt") or 0),
                    time=float(summary.get("time") or now),
                    intervals=int(summary.get("intervals", 0)),
                    step_time_sum_s=float(summary.get("step_time_sum_s", 0.0)),
                    node=summary.get("node"), gpu_ids=tuple(summary.get("gpu_ids") or ()),
                    first_time=summary.get("first_time"), judge=False)
            mono = time.monotonic()
            verdicts: list[Any] = []
            if self.detector.ranks() < JUDGE_ALWAYS_BELOW or mono - self._judged >= JUDGE_EVERY_S:
                verdicts, self._scores = self.detector.judge_scores(now)
                self._judged = mono
            scores = self._scores
        if merge and len(batch) > 1:  # one event for the batch: its lowest rank's
            lead_summary = min(batch, key=lambda s: int(s.get("rank", -1)))
            for summary in batch:
                if summary is not lead_summary:
                    self._apply_summary(summary, scores)
            lead = self._steps_event(lead_summary, scores.get(int(lead_summary.get("rank", -1))))
            lasts = [s["last_step"] for s in batch if isinstance(s.get("last_step"), int)]
            lead["ranks"] = sorted(int(s.get("rank", -1)) for s in batch)
            lead["ranks_last_step"] = max(lasts) if lasts else None
            events = [lead]
        else:
            events = [self._steps_event(s, scores.get(int(s.get("rank", -1)))) for s in batch]
        last = batch[-1]
        for v in verdicts:
            events.append(make_event("straggler", describe(v), rank=v.rank, node=v.node,
                                     step=last.get("last_step"),
                                     attempt=int(last.get("attempt") or 0), **verdict_fields(v)))
        return events

    def states(self) -> dict[int, tuple[float | None, bool, str | None]]:
        """Every rank's ``(score, flagged, node)`` as last judged (the eviction's input)."""
        with self._lock:
            return self.detector.states(self._scores)

    def _apply_summary(self, summary: dict[str, Any], scores: dict[int, float]) -> None:
        if self.metrics is not None:
            rank = int(summary.get("rank", -1))
            self._apply(summary_updates(rank, summary, scores.get(rank)))

    def _steps_event(self, summary: dict[str, Any], score: float | None) -> dict[str, Any]:
        rank = int(summary.get("rank", -1))
        if self.metrics is not None:
            self._apply(summary_updates(rank, summary, score))
        fields = {k: v for k, v in summary.items()
                  if k not in ("rank", "node", "attempt", "time", "kind", "detail", "step")}
        mean = (summary["step_time_sum_s"] / summary["intervals"]) if summary.get("intervals") else None
        detail = (f"rank {rank}: steps {summary.get('first_step')}..{summary.get('last_step')}, "
                  f"{summary.get('reports')} report(s)"
                  + (f", mean step {mean * 1e3:.2f} ms" if mean is not None else ""))
        return make_event("steps", detail, rank=rank, node=summary.get("node"),
                          step=summary.get("last_step"), attempt=int(summary.get("attempt") or 0),
                          straggler_score=score, **fields)

    def _apply(self, updates: list[Update]) -> None:
        if not updates or self.metrics is None:
            return
        try:
            self.metrics.apply(updates)
        except Exception as exc:  # observing must never break the run
            logger.warning("rayguard: could not update metrics: %s", exc)
