"""The report and ``events --goodput`` read a log through a digest: the same figures as
from every event, in memory that does not grow with the step summaries, read in parallel
parts or in one, with the fast path or without; curves thinned evenly within a budget."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from typing import Any

import pytest

from rayguard.checkpoint.interval_advice import recommend_interval
from rayguard.events import fast
from rayguard.events.lines import EventSource, split_points
from rayguard.events.record import json_safe
from rayguard.observe.digest import LogDigest, digest_log
from rayguard.observe.goodput import goodput
from rayguard.observe.report import render
from rayguard.observe.thinning import MAX_POINTS, Thinned
from rayguard.observe.timeline import build_run, build_run_digest


def long_run(attempts: int, summaries: int, seed: int = 0) -> list[dict[str, Any]]:
    """A run's events in time order: 2 ranks' summaries, commits, a restart per attempt."""
    rng = random.Random(seed)
    t, step = 1.7e9, 0
    events = [{"time": t, "kind": "start", "rank": None, "node": None, "step": None,
               "attempt": 0, "detail": "fit() started"}]
    for a in range(attempts):
        events.append({"time": t + 1, "kind": "attempt_started", "rank": 0, "node": "n0",
                       "step": None, "attempt": a, "detail": "", "world_size": 2,
                       "group_start_time": t, "setup_start_time": t + 0.5})
        if a:
            events.append({"time": t + 2, "kind": "restored", "rank": 0, "node": "n0",
                           "step": step - 30, "attempt": a, "detail": "", "fallback": False})
            step -= 29
        for i in range(summaries):
            t += 5
            for rank in (0, 1):
                events.append({
                    "time": t + rank * 0.01, "kind": "steps", "rank": rank, "node": f"n{rank}",
                    "step": step + 49, "attempt": a, "detail": "", "reports": 50,
                    "intervals": 50 if i else 49, "step_time_sum_s": rng.uniform(4, 6),
                    "first_step": step, "last_step": step + 49, "first_time": t - 5,
                    "last_time": t, "metric": "loss" if rank == 0 else None, "gpu_ids": [rank],
                    "samples": [[s, 1 / (s + 1)] for s in range(step, step + 50, 5)]
                    if rank == 0 else []})
            step += 50
            if i % 10 == 9:
                events.append({"time": t + 0.5, "kind": "checkpoint_committed", "rank": 0,
                               "node": "n0", "step": step - 1, "attempt": a, "detail": "",
                               "bytes": 1000, "seconds": 1.0, "blocked_s": 0.2,
                               "path": f"/c{step}"})
        t += 3
        kind = "finished" if a == attempts - 1 else "worker_died"
        events.append({"time": t, "kind": kind, "rank": 1, "node": "n1", "step": None,
                       "attempt": a, "detail": "rank 1 failed (kill)", "failure": "kill"})
        if kind == "worker_died":
            events.append({"time": t + 0.5, "kind": "restart", "rank": None, "node": None,
                           "step": None, "attempt": a, "detail": "", "cause": "kill"})
        t += 10
    return events


def write(path: Any, events: list[dict[str, Any]]) -> EventSource:
    with open(path, "w") as f:
        f.write("".join(json.dumps(json_safe(e), sort_keys=True) + "\n" for e in events))
    return EventSource("run", str(path))


def close(a: Any, b: Any, where: str = "") -> None:
    """Equal, floats within rounding (sums taken in another order), at any depth."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9), where
    else:
        assert a == b, where


def without_curves(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("throughput", "metric")}


def test_the_digest_gives_the_figures_of_every_event(tmp_path):
    events = long_run(attempts=4, summaries=60)
    source = write(tmp_path / "rayguard_events.jsonl", events)
    expected = goodput(events).to_dict()
    for options in ({}, {"fast": False}, {"workers": 3, "parallel_min_bytes": 0}):
        digest = digest_log(source, **options)
        close(goodput(digest.compact.events()).to_dict(), expected, str(options))
        close(recommend_interval(digest.events()).to_dict(),
              recommend_interval(events).to_dict())
        data = build_run_digest(digest)
        close(without_curves(data), without_curves(build_run(events)), str(options))
        assert data["counts"]["steps"] == 4 * 60 * 2 and digest.bad_lines == 0
        assert [s["attempt"] for s in data["metric"]["series"]] == [0, 1, 2, 3]


_READ_IN_PARTS = """
import json, sys, threading
from rayguard.events.lines import EventSource
from rayguard.observe.digest import digest_log, read_workers
from rayguard.observe.timeline import build_run_digest
source = EventSource("run", sys.argv[1])
out = {"alone": [threading.active_count(), read_workers(4)]}
out["serial"] = build_run_digest(digest_log(source, workers=1))
out["parallel"] = build_run_digest(digest_log(source, workers=4, parallel_min_bytes=0))
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()
out["threaded"] = [read_workers(4), read_workers(None)]
out["while_threaded"] = build_run_digest(digest_log(source, workers=4, parallel_min_bytes=0))
stop.set()
print(json.dumps(out))
"""


def _read_in_fresh_process(source: EventSource) -> dict[str, Any]:
    """The log read serially, in 4 parts, and in 4 parts asked while another thread runs, by
    a fresh process (this one may hold other tests' threads, which keep a read in one part)."""
    out = subprocess.run([sys.executable, "-c", _READ_IN_PARTS, source.path], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return json.loads(out.strip().split("\n")[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="the parts are read by forked processes")
def test_parallel_parts_start_at_lines_and_give_the_serial_curves(tmp_path):
    source = write(tmp_path / "rayguard_events.jsonl", long_run(attempts=3, summaries=400))
    parts = split_points(source, 4)
    data = open(source.path, "rb").read()
    assert len(parts) == 4 and parts[-1][1] is None
    assert all(start == 0 or data[start - 1:start] == b"\n" for start, _ in parts)
    read = _read_in_fresh_process(source)
    assert read["alone"] == [1, 4]
    serial, parallel = read["serial"], read["parallel"]
    close(without_curves(parallel), without_curves(serial))
    for key in ("throughput", "metric"):
        assert abs(len(json.dumps(parallel[key])) - len(json.dumps(serial[key]))) < 0.3 * len(
            json.dumps(serial[key]))
    # a fork while another thread holds a lock (logging's, an allocator's) can hang the
    # child: the parts asked for are kept only while the thread is alone
    assert read["threaded"] == [1, 1]
    assert read["while_threaded"] == serial


def test_the_digest_does_not_grow_with_the_summaries():
    sizes = []
    for summaries in (100, 2000):
        events = long_run(attempts=3, summaries=summaries)
        digest = LogDigest.of(events)
        samples = digest.series._samples["loss"]  # type: ignore[union-attr]
        others = sum(e["kind"] != "steps" for e in events)
        # the other events, and the earliest and latest summary between two of them
        assert len(digest.events()) <= 3 * others
        assert samples.points <= samples.limit()
        sizes.append((len(digest.compact), samples.points,
                      digest.series._progress.points))  # type: ignore[union-attr]
    (compact_a, _, _), (compact_b, points_b, progress_b) = sizes
    assert compact_a == compact_b  # a few events per attempt
    assert points_b <= 4 * MAX_POINTS + 2 * 400 * 3 and progress_b <= 4 * MAX_POINTS + 100


def test_thinned_series_keep_an_even_share_and_a_floor():
    thinned = Thinned(budget_points=100, floor_points=10)
    for i in range(10_000):
        thinned.add("long", i)
    for i in range(15):
        thinned.add("short", i)
    long = thinned.items("long")
    assert thinned.points <= thinned.limit() and 50 <= len(long) <= 100 + 20
    gaps = {b - a for a, b in zip(long, long[1:], strict=False)}
    assert len(gaps) == 1  # evenly spaced
    assert len(thinned.items("short")) >= 10  # a short series keeps its floor
    later = Thinned(budget_points=100, floor_points=10)
    for i in range(10_000, 12_000):
        later.add("long", i)
    thinned.merge("long", later)
    merged = thinned.items("long")
    assert merged == sorted(merged) and merged[-1] >= 11_000 and thinned.offered("long") == 12_000


def test_a_report_of_hundreds_of_attempts_draws_in_few_traces():
    data = build_run(long_run(attempts=300, summaries=3))
    assert len(data["attempts"]) == 300
    t0 = time.process_time()
    page = render(data)
    assert time.process_time() - t0 < 20  # a trace and a vline each took minutes
    traces = page.count('"type":"scatter"') + page.count('"type":"bar"')
    assert 0 < traces < 40


def test_without_msgspec_the_figures_are_the_same(tmp_path, monkeypatch):
    source = write(tmp_path / "rayguard_events.jsonl", long_run(attempts=2, summaries=30))
    with_fast = build_run_digest(digest_log(source))
    monkeypatch.setattr(fast, "msgspec", None)
    assert fast.decoder() is None
    close(build_run_digest(digest_log(source)), with_fast)
