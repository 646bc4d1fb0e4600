"""The driver's console while ``fit()`` runs: a compact progress line every few seconds and
one line per event a person must see (a restart, a stall, a rejected checkpoint, a NaN).

Rank 0 sends its latest step and metrics to the run's coordinator at most every
:data:`SEND_INTERVAL_S` (fire-and-forget, so a report costs no round trip); a daemon thread in
the driver reads them and prints only when something changed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

logger = logging.getLogger("rayguard")

SEND_INTERVAL_S = 2.0
"""Rank 0 sends its progress to the coordinator at most this often."""

NOTABLE_KINDS = frozenset({"worker_died", "restart", "stall_detected", "nan_detected",
                           "checkpoint_rejected", "crash_loop", "not_retried", "straggler",
                           "preemption_notice", "preemption_checkpoint"})
"""Event kinds printed on the driver's console as they happen."""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def progress_line(progress: dict[str, Any], steps_per_s: float | None) -> str:
    """``step 40 | loss 0.0552 | 12.3 steps/s | attempt 0 | 2 workers | checkpoint step 39``."""
    parts = [f"step {progress.get('step', '?')}"]
    metrics = progress.get("metrics") or {}
    name = "loss" if "loss" in metrics else next((k for k in metrics if k != "step"), None)
    if name is not None:
        parts.append(f"{name} {_fmt(metrics[name])}")
    if steps_per_s is not None:
        parts.append(f"{steps_per_s:.3g} steps/s")
    parts.append(f"attempt {progress.get('attempt', 0)}")
    if progress.get("world_size") is not None:
        parts.append(f"{progress['world_size']} worker(s)")
    ckpt = progress.get("checkpoint_step")
    parts.append("no checkpoint yet" if ckpt is None else f"checkpoint step {ckpt}")
    return " | ".join(parts)


def event_line(event: dict[str, Any]) -> str:
    where = ", ".join(x for x in (
        f"attempt {event['attempt']}" if event.get("attempt") is not None else "",
        f"rank {event['rank']}" if event.get("rank") is not None else "",
        f"step {event['step']}" if event.get("step") is not None else "") if x)
    return f"{event.get('kind')} ({where}): {event.get('detail', '')}"


class ProgressPrinter:
    """Daemon thread in the driver; ``stop()`` prints what is still unprinted."""

    def __init__(self, coordinator: Any, interval_s: float) -> None:
        self.coordinator = coordinator
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._events_seen = 0
        self._printed: tuple[int, float] | None = None
        """(step, the worker's time of it) of the last line printed."""
        self._printed_at = float("-inf")
        """``time.monotonic()`` here when that line was printed."""
        self._thread = threading.Thread(target=self._run, name="rayguard-progress", daemon=True)

    def start(self) -> ProgressPrinter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll_events()
        self._poll_progress()  # the last step, unless already printed

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.interval_s)):
            self._poll_events()
            if time.monotonic() - self._printed_at >= self.interval_s:
                self._poll_progress()

    def _poll_events(self) -> None:
        import ray

        try:
            events = ray.get(self.coordinator.notable_events.remote(self._events_seen), timeout=10)
        except Exception:  # the coordinator is gone (end of fit) or busy: try again later
            return
        self._events_seen += len(events)
        for event in events:
            logger.warning("%s", event_line(event))

    def _poll_progress(self) -> None:
        import ray

        try:
            progress = ray.get(self.coordinator.get_progress.remote(), timeout=10)
        except Exception:
            return
        step, at = progress.get("step"), progress.get("time")
        if step is None or at is None:
            return
        rate = None
        if self._printed is not None:
            prev_step, prev_at = self._printed
            if step == prev_step:
                return  # nothing new since the last line
            if isinstance(step, int) and at > prev_at and step > prev_step:
                rate = (step - prev_step) / (at - prev_at)
        self._printed, self._printed_at = (step, at), time.monotonic()
        logger.info("%s", progress_line(progress, rate))
