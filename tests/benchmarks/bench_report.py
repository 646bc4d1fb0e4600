"""Time of ``rayguard report`` and ``rayguard events --goodput`` on a long event log (targets
on a 2-core machine, for 1 000 000 events: report < 5 s, goodput < 3 s), their peak memory,
and the parse throughput of the reader against the parser it replaced.

The log is synthetic but shaped like a long run's and encoded as the run's writer encodes
it (``EventLog``: sorted keys, non-finite floats as strings): 2 ranks x step summaries every
5 s (as the coordinator writes them: the summary's fields, ``gpu_ids``, a straggler score;
rank 0's with 25 loss samples), a checkpoint every 100 summaries, and a kill/hang/NaN
restart (``worker_died``, ``restart``, ``attempt_started``, ``restored``) every 5 000
events. Prints:

- parse throughput on the log's first lines: the parser this replaced (the bounded
  parser with per-number hooks and a copying walk, kept below as the baseline), the
  standard library's ``json.loads`` (no bounds), today's ``loads_line`` (C parser + bounds
  walk) and the fast path for step summaries (msgspec, when installed);
- the two commands, each in a new process (interpreter, imports, read, analysis, output),
  wall and CPU seconds and the process's peak RSS; and ``write_report`` in this process.

    .venv/bin/python tests/benchmarks/bench_report.py [--events 1000000] [--dir DIR]

``--dir``: keep the log there (made once, reused by later runs with the same count).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any


def _event(t: float, kind: str, *, rank: int | None = None, node: str | None = None,
           step: int | None = None, attempt: int, detail: str, **extra: Any) -> dict[str, Any]:
    # the shape of rayguard.events.make_event
    return {"time": t, "kind": kind, "rank": rank, "node": node, "step": step,
            "attempt": attempt, "detail": detail, **extra}


def _summary(t: float, rank: int, step: int, attempt: int) -> dict[str, Any]:
    # as RunObserver.on_summaries writes a rank's StepTimer summary
    samples = [[s, 1.0 / (s + 1)] for s in range(step, step + 50, 2)] if rank == 0 else []
    return _event(t, "steps", rank=rank, node=f"n{rank}", step=step + 49, attempt=attempt,
                  detail=f"rank {rank}: steps {step}..{step + 49}, 50 report(s), mean step "
                         "98.00 ms",
                  reports=50, intervals=50, step_time_sum_s=4.9, step_time_max_s=0.2,
                  blocked_sum_s=0.01, blocked_max_s=0.001, first_step=step,
                  last_step=step + 49, first_time=t - 5, last_time=t - 0.05,
                  metric="loss" if rank == 0 else None, samples=samples, gpu_ids=[rank],
                  straggler_score=1.0 + 0.01 * rank)


def synthetic_log(path: str, n_events: int) -> int:
    from rayguard.events.record import json_safe

    t, attempt, step, written = 1.7e9, 0, 0, 0
    causes = ("kill", "hang", "nan")
    with open(path, "w") as f:
        def put(event: dict[str, Any]) -> None:
            nonlocal written
            f.write(json.dumps(json_safe(event), sort_keys=True) + "\n")  # as EventLog writes
            written += 1

        put(_event(t, "start", attempt=0, detail="fit() started"))
        put(_event(t, "attempt_started", rank=0, node="n0", attempt=0, detail="attempt 0",
                   world_size=2))
        while written < n_events - 1:
            t += 5.0
            for rank in (0, 1):
                put(_summary(t, rank, step, attempt))
            step += 50
            if written % 200 < 2:
                put(_event(t, "checkpoint_committed", rank=0, node="n0", step=step - 1,
                           attempt=attempt, detail="committed", bytes=10**9, seconds=2.0,
                           blocked_s=0.5, path=f"/r/c{step}"))
            if written % 5000 < 3 and written > 10:
                cause = causes[attempt % 3]
                put(_event(t + 1, "worker_died", rank=1, node="n1", attempt=attempt,
                           detail=f"rank 1 failed ({cause})", failure=cause))
                put(_event(t + 1, "restart", attempt=attempt, detail="restart", cause=cause))
                attempt += 1
                t += 30
                put(_event(t, "attempt_started", rank=0, node="n0", attempt=attempt,
                           detail="attempt", world_size=2))
                put(_event(t + 1, "restored", rank=0, node="n0", step=step - 100,
                           attempt=attempt, detail="restored", fallback=False))
                step -= 99
        put(_event(t + 1, "finished", attempt=attempt, detail="run finished"))
    return written


# -- the parser this replaced (rayguard 0.1's safejson.loads_line), the baseline ----------
def _old_loads_line(data: bytes) -> Any:
    def parse_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(text)
        return value

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > 19:
            raise ValueError(text)
        return int(text)

    def clean(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return text

    def checked(value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return clean(value)
        if isinstance(value, (dict, list)):
            if depth >= 32:
                raise ValueError("deep")
            if isinstance(value, dict):
                return {clean(k): checked(v, depth + 1) for k, v in value.items()}
            return [checked(v, depth + 1) for v in value]
        return value

    value = json.loads(data.decode("utf-8", "replace"), parse_float=parse_float,
                       parse_int=parse_int, parse_constant={"NaN": "nan"}.get)
    return checked(value, 0)


def parse_throughput(path: str, max_lines: int = 100_000) -> list[tuple[str, float, float]]:
    """``(parser, MiB/s, lines/s)`` on the log's first ``max_lines`` lines."""
    from rayguard.events.fast import decoder
    from rayguard.safejson import loads_line

    with open(path, "rb") as f:
        lines = [line for _, line in zip(range(max_lines), f, strict=False)]
    mib = sum(map(len, lines)) / 2**20
    parsers = [("old bounded parser (baseline)", _old_loads_line),
               ("json.loads (no bounds)", json.loads), ("loads_line (bounds walk)", loads_line)]
    fast = decoder()
    if fast is not None:
        decode, errors = fast

        def fast_or_reference(line: bytes) -> Any:
            try:
                return decode(line)
            except errors:
                return loads_line(line)

        parsers.append(("fast path (msgspec) + loads_line for the rest", fast_or_reference))
    out = []
    for name, parse in parsers:
        c0 = time.process_time()
        for line in lines:
            parse(line)
        cpu = time.process_time() - c0
        out.append((name, mib / cpu, len(lines) / cpu))
    return out


def _timed(args: list[str]) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS (MiB) of one command in a new process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rayguard", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"rayguard {' '.join(args)} failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="keep the log here (reused)")
    args = parser.parse_args()
    run_dir = args.dir or tempfile.mkdtemp(prefix="bench-report-")
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "rayguard_events.jsonl")
    stamp = os.path.join(run_dir, "events.count")
    if not (os.path.exists(stamp) and open(stamp).read() == str(args.events)):
        n = synthetic_log(log, args.events)
        with open(stamp, "w") as f:
            f.write(str(args.events))
    else:
        n = args.events
    print(f"log: {n} events, {os.path.getsize(log) / 2**20:.1f} MiB")

    rows = parse_throughput(log)
    base = rows[0][1]
    print(f"{'parse (first 100 000 lines, cpu)':48s}{'MiB/s':>8s}{'lines/s':>10s}")
    for name, mib_s, lines_s in rows:
        print(f"{name:48s}{mib_s:8.1f}{lines_s:10.0f}   {mib_s / base:.1f}x the baseline")

    print(f"{'command (new process)':48s}{'wall s':>8s}{'cpu s':>8s}{'peak MiB':>10s}")
    for label, cmd, target in (
            ("rayguard report", ["report", run_dir, "-o", os.path.join(run_dir, "cli.html")], 5),
            ("rayguard events --goodput", ["events", run_dir, "--goodput"], 3)):
        wall, cpu, rss = _timed(cmd)
        print(f"{label:48s}{wall:8.2f}{cpu:8.2f}{rss:10.0f}   (target < {target} s at 1M)")

    from rayguard.observe.report import write_report

    t0, c0 = time.perf_counter(), time.process_time()
    out = write_report(run_dir, os.path.join(run_dir, "inproc.html"))
    print(f"{'write_report in process (this process)':48s}{time.perf_counter() - t0:8.2f}"
          f"{time.process_time() - c0:8.2f}")
    print(f"page: {os.path.getsize(out) / 2**20:.1f} MiB; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
