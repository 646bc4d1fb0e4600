"""The live goodput keeps a bounded log: a few events per attempt and rank however long the
run, and the same figure as from every event (long logs of kills, hangs, NaNs, preemptions,
commits with and without ``blocked_s``, several ranks, out of order)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rayguard.observe.goodput import goodput
from rayguard.observe.goodput_meter import CompactLog, GoodputMeter

T0 = 1_700_000_000.0


def long_log(seed: int, summaries: int, short_p: float = 0.3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t, step, events = T0, 0, [{"kind": "start", "time": T0}]
    failures = ["kill", "stall", "nan", "preempt", None]
    for attempt in range(rng.randint(1, 4)):
        t += rng.uniform(1, 5)
        events.append({"kind": "attempt_started", "attempt": attempt, "time": t,
                       "group_start_time": t - 2, "setup_start_time": t - 1})
        if attempt:
            restored = max(step - rng.randint(1, 30), 0)
            events.append({"kind": "restored", "attempt": attempt, "step": restored,
                           "time": t + 0.2})
            step = restored + 1
        short = rng.random() < short_p  # ends before its second summary: no interval measured
        for i in range(1 if short else summaries):
            t += rng.uniform(4, 6)
            for rank in (0, 1, 2):
                n = 0 if short else rng.randint(5, 50)
                events.append({"kind": "steps", "attempt": attempt, "rank": rank,
                               "first_step": step, "last_step": step + n, "intervals": n,
                               "step_time_sum_s": n * 0.1, "reports": n + 1,
                               "first_time": t - 4 + rank * 0.01, "last_time": t,
                               "time": t + 0.01, "samples": [[1, 2.0]] * 10,
                               **({"begin_time": t - 4.5} if i == 0 else {}),
                               **({"replay_time_s": n * 0.3, "replay_steps": n}
                                  if i == 0 and attempt and n else {})})
            step += 50
            t += 5 if short else 0
            if rng.random() < 0.5:
                events.append({"kind": "checkpoint_committed", "attempt": attempt,
                               "step": step, "time": t + 0.3, "seconds": 0.8,
                               **({"blocked_s": 0.3} if rng.random() < 0.7 else {})})
            if rng.random() < 0.2:
                events.append({"kind": "straggler", "attempt": attempt, "rank": 2,
                               "step": step, "time": t + 0.1})
        failure = rng.choice(failures)
        if failure is None:
            break
        t += 1
        if failure == "stall":
            events.append({"kind": "stall_detected", "attempt": attempt, "step": step,
                           "timeout_s": 3.0, "time": t})
        elif failure == "preempt":
            events.append({"kind": "preemption_notice", "attempt": attempt, "step": step,
                           "time": t})
        else:
            events.append({"kind": "fault_injected" if failure == "kill" else "nan_detected",
                           "attempt": attempt, "step": step + 7, "time": t})
        for rank in (0, 1, 2):
            events.append({"kind": "worker_died", "attempt": attempt, "rank": rank,
                           "time": t + 1 + rank * 0.1})
        events.append({"kind": "restart", "attempt": attempt, "time": t + 1.5})
        t += 2
    end = rng.choice(["finished", "failed", None])
    if end is not None:
        events.append({"kind": end, "time": t + 3})
    rng.shuffle(events)  # the order the coordinator writes them in is not the time order
    return events


def close(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b), where
    else:
        assert a == b, where


def same(a: Any, b: Any) -> None:
    close(a.to_dict(), b.to_dict())


@pytest.mark.parametrize("seed", range(40))
def test_the_compact_log_gives_the_figure_of_every_event(seed):
    events = long_log(seed, summaries=30)
    log = CompactLog()
    for e in events:
        log.add(e)
    same(goodput(log.events()), goodput(events))


def test_the_compact_log_does_not_grow_with_the_run():
    sizes, counts = [], []
    for summaries in (10, 100, 1000):
        log, events = CompactLog(), long_log(3, summaries, short_p=0.0)
        for e in events:
            log.add(e)
        sizes.append(len(log))
        counts.append(len(events))
    assert counts[2] > 5_000 and max(sizes) < 60  # the kinds x attempts x ranks, no more


def test_the_meter_publishes_the_figure_of_the_compact_log():
    clock = [0.0]
    meter = GoodputMeter(interval_s=10.0, clock=lambda: clock[0])
    events = sorted(long_log(5, 20), key=lambda e: e["time"])
    updates = []
    for e in events:
        clock[0] += 1.0
        updates += meter.on_event(e)
    assert len(meter.log) < 60
    ratio = [u for u in updates if "goodput_ratio" in str(u)]
    assert ratio, updates
