"""How long rayguard.tune.run() takes to return in a driver that has not imported torch,
vs constructing a plain Tuner in the same driver (the baseline), and what registering the
serializers on the caller's thread cost before (an `import torch`).

    .venv/bin/python tests/benchmarks/bench_tune_return.py [--repeats 3]

Starts its own local Ray cluster (address="local"); each measurement runs in a fresh driver
process (tests/ray/tune_cold_driver.py) connected to it. Prints medians and a ratio; never
fails on a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import ray

SCRIPT = Path(__file__).resolve().parent.parent / "ray" / "tune_cold_driver.py"


def _driver(address: str, storage: str, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), address, storage, *extra],
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    address = ray.get_runtime_context().gcs_address
    ours, plain, sync = [], [], []
    with tempfile.TemporaryDirectory() as storage:
        for _ in range(args.repeats):
            out = _driver(address, storage)
            assert not out["torch_before"]
            ours.append(out["run_s"])
            plain.append(out["plain_tuner_s"])
            sync.append(_driver(address, storage, "--sync-register")["sync_register_s"])
    ray.shutdown()
    o, p, s = (statistics.median(x) for x in (ours, plain, sync))
    print(f"rayguard.tune.run() return, driver without torch (median of {args.repeats}): "
          f"{o * 1000:.1f} ms; plain Tuner(): {p * 1000:.1f} ms; ratio {o / p:.2f}x")
    print(f"registering the serializers on the caller's thread (before): {s:.2f} s "
          f"(now in a background thread)")


if __name__ == "__main__":
    main()
