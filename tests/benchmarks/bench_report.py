"""Time of ``rayguard report`` on a 100 000-event log (target < 5 s).

The log is synthetic but shaped like a long run's: 2 ranks x 49 000 step summaries (rank 0's
with loss samples, as rayguard writes them), a checkpoint every 100 summaries, and a kill/hang/NaN restart every few
thousand events. Prints the time of the command (a new process: interpreter, plotly
import, read, analysis, HTML) and of ``write_report`` alone in this process, with the
baseline of reading and parsing the same log only (``rayguard events --json``-style).

    .venv/bin/python tests/benchmarks/bench_report.py [--events 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def synthetic_log(path: str, n_events: int) -> int:
    t, attempt, step, written = 1.7e9, 0, 0, 0
    causes = ("kill", "hang", "nan")
    with open(path, "w") as f:
        def put(event):
            nonlocal written
            f.write(json.dumps(event) + "\n")
            written += 1

        put({"time": t, "kind": "start", "rank": None, "node": None, "step": None,
             "attempt": 0, "detail": "fit() started"})
        put({"time": t, "kind": "attempt_started", "rank": 0, "node": "n0", "step": None,
             "attempt": 0, "detail": "attempt 0", "world_size": 2})
        while written < n_events - 1:
            t += 5.0
            for rank in (0, 1):
                put({"time": t, "kind": "steps", "rank": rank, "node": f"n{rank}", "step": step + 49,
                     "attempt": attempt, "detail": f"rank {rank}: steps", "reports": 50,
                     "intervals": 50, "step_time_sum_s": 4.9, "step_time_max_s": 0.2,
                     "blocked_sum_s": 0.01, "blocked_max_s": 0.001, "first_step": step,
                     "last_step": step + 49, "first_time": t - 5,
                     "metric": "loss" if rank == 0 else None,
                     "samples": [[s, 1.0 / (s + 1)] for s in range(step, step + 50, 2)]
                     if rank == 0 else []})
            step += 50
            if written % 200 < 2:
                put({"time": t, "kind": "checkpoint_committed", "rank": 0, "node": "n0",
                     "step": step - 1, "attempt": attempt, "detail": "committed",
                     "bytes": 10**9, "seconds": 2.0, "path": f"/r/c{step}"})
            if written % 5000 < 3 and written > 10:
                cause = causes[attempt % 3]
                put({"time": t + 1, "kind": "worker_died", "rank": 1, "node": "n1", "step": None,
                     "attempt": attempt, "detail": f"rank 1 failed ({cause})"})
                put({"time": t + 1, "kind": "restart", "rank": None, "node": None, "step": None,
                     "attempt": attempt, "detail": "restart", "cause": cause})
                attempt += 1
                t += 30
                put({"time": t, "kind": "attempt_started", "rank": 0, "node": "n0", "step": None,
                     "attempt": attempt, "detail": "attempt", "world_size": 2})
                put({"time": t + 1, "kind": "restored", "rank": 0, "node": "n0",
                     "step": step - 100, "attempt": attempt, "detail": "restored"})
                step -= 99
        put({"time": t + 1, "kind": "finished", "rank": None, "node": None, "step": None,
             "attempt": attempt, "detail": "run finished"})
    return written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    run_dir = tempfile.mkdtemp(prefix="bench-report-")
    n = synthetic_log(os.path.join(run_dir, "rayguard_events.jsonl"), args.events)
    size = os.path.getsize(os.path.join(run_dir, "rayguard_events.jsonl"))
    print(f"log: {n} events, {size / 2**20:.1f} MiB")

    from rayguard.events.read import locate, read_log
    from rayguard.observe.report import write_report

    # CPU seconds beside wall seconds: on a shared, loaded machine the wall time mostly
    # measures the neighbours; the CPU time is what the command costs.
    t0, c0 = time.perf_counter(), time.process_time()
    read_log(locate(run_dir))
    read_s, read_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    out = write_report(run_dir, os.path.join(run_dir, "inproc.html"))
    inproc_s, inproc_cpu = time.perf_counter() - t0, time.process_time() - c0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rayguard", "report", run_dir, "-o",
                    os.path.join(run_dir, "cli.html")], check=True, capture_output=True)
    cli_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cli_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"{'':32s}{'wall s':>8s}{'cpu s':>8s}")
    print(f"{'read + parse only (baseline)':32s}{read_s:8.2f}{read_cpu:8.2f}")
    print(f"{'write_report in process':32s}{inproc_s:8.2f}{inproc_cpu:8.2f}"
          f"   ({inproc_cpu / read_cpu:.1f}x the read, cpu)")
    print(f"{'rayguard report (new process)':32s}{cli_s:8.2f}{cli_cpu:8.2f}   (target < 5 s)")
    print(f"page: {os.path.getsize(out) / 2**20:.1f} MiB; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
