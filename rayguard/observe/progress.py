"""The driver's console while ``fit()`` runs: a compact progress line every few seconds and
one line per event a person must see (a restart, a stall, a rejected checkpoint, a NaN).

Rank 0 sends its latest step and metrics to the run's coordinator at most every
:data:`rayguard.constants.SEND_INTERVAL_S` (fire-and-forget, so a report costs no round trip);
a daemon thread in the driver reads them and prints only when something changed. The events
printed as they happen are :data:`rayguard.events.kinds.NOTABLE_KINDS`; the coordinator
picks them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from rayguard.observe.goodput_table import noun

logger = logging.getLogger("rayguard")

def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def progress_line(progress: dict[str, Any], steps_per_s: float | None) -> str:
    """``step 40 | loss 0.0552 | 12.3 steps/s | attempt 0 | 2 workers | checkpoint step 39``,
    in the loop's own unit (``epoch 7 | ... | 0.5 epochs/s | ... | checkpoint epoch 6``)."""
    unit = noun(str(progress.get("unit") or "step"))
    parts = [f"{unit} {progress.get('step', '?')}"]
    metrics = progress.get("metrics") or {}
    name = "loss" if "loss" in metrics else next((k for k in metrics if k != "step"), None)
    if name is not None:
        parts.append(f"{name} {_fmt(metrics[name])}")
    if steps_per_s is not None:
        parts.append(f"{steps_per_s:.3g} {unit}s/s")
    parts.append(f"attempt {progress.get('attempt', 0)}")
    if progress.get("world_size") is not None:
        parts.append(f"{progress['world_size']} worker(s)")
    ckpt = progress.get("checkpoint_step")
    parts.append("no checkpoint yet" if ckpt is None else f"checkpoint {unit} {ckpt}")
    return " | ".join(parts)


def attempt_view(latest: dict[str, Any], attempt: int, commits: list[int]) -> dict[str, Any]:
    """What the progress line may show while ``attempt`` runs, from ``latest`` (the last update
    rank 0 sent, stamped with its ``attempt``) and ``commits`` (the steps of the checkpoints
    this ``fit()`` committed, in order).

    Rank 0 sends its step at most every ``SEND_INTERVAL_S``, while a commit is recorded at
    once, so the two must be matched: the checkpoint shown is the last one committed at or
    before the step shown (never a later one, as ``step 0 | checkpoint step 59``). A step of an
    earlier attempt is not shown (a restarted group has not reported yet: its step is unknown,
    not the dead group's). The metrics stay (``RobustTrainer.last_metrics``)."""
    view = {k: v for k, v in latest.items() if k != "checkpoint_step"}
    view["attempt"] = attempt
    if latest.get("attempt", attempt) != attempt:
        view.pop("step", None)
        view.pop("time", None)
    step = view.get("step")
    if isinstance(step, int):
        view["checkpoint_step"] = next((s for s in reversed(commits) if s <= step), None)
    else:
        view["checkpoint_step"] = commits[-1] if commits else None
    return view


def next_line(printed: tuple[int, int, float] | None,
              progress: dict[str, Any]) -> tuple[str, tuple[int, int, float]] | None:
    """The line to print for ``progress`` and the new ``(attempt, step, time)`` printed, or
    None when there is nothing new. ``printed``: the last one printed. Steps/s compare two
    points of one attempt only (a restart resumes at another step after a pause)."""
    step, at, attempt = progress.get("step"), progress.get("time"), progress.get("attempt", 0)
    if step is None or at is None:
        return None
    rate = None
    if printed is not None:
        prev_attempt, prev_step, prev_at = printed
        if (attempt, step) == (prev_attempt, prev_step):
            return None  # nothing new since the last line
        if attempt == prev_attempt and isinstance(step, int) and at > prev_at and step > prev_step:
            rate = (step - prev_step) / (at - prev_at)
    return progress_line(progress, rate), (attempt, step, at)


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
        self._printed: tuple[int, int, float] | None = None
        """(attempt, step, the worker's time of it) of the last line printed."""
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
        line = next_line(self._printed, progress)
        if line is None:
            return
        text, self._printed = line
        self._printed_at = time.monotonic()
        logger.info("%s", text)
