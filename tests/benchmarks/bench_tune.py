"""rayguard.tune benchmark: stall-to-restart, the health callback's cost per result, and the
time for run() to return; plain Ray Tune measured in the same process as the baseline.

    .venv/bin/python tests/benchmarks/bench_tune.py [--quick]

Starts its own local Ray cluster (address="local"). Prints medians and ratios; never fails
on a time.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
import ray.cloudpickle as cloudpickle
from ray import tune

import rayguard
import rayguard.tune as rt

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "tune_trainables", HERE.parent / "ray" / "tune_trainables.py")
trainables = importlib.util.module_from_spec(_spec)
sys.modules["tune_trainables"] = trainables
_spec.loader.exec_module(trainables)
cloudpickle.register_pickle_by_value(trainables)

STALL_TIMEOUT_S = 3.0
FAULT_STEP = 3


def _health(**kw) -> rayguard.HealthConfig:
    return rayguard.HealthConfig(**{"stall_timeout_s": STALL_TIMEOUT_S, **kw})


SWEEP = rt.SweepHealthConfig(min_results=3, window=5)


def _stall_space(tmp: str) -> dict:
    return {"kind": "stall", "marker_dir": tmp, "fault_step": FAULT_STEP, "steps": 6,
            "step_s": 0.05}


def stall_ours(storage: str) -> tuple[float, float]:
    """Seconds from the stall to the restart decision, and to the first result after it."""
    with tempfile.TemporaryDirectory() as marker:
        run = rt.run(trainables.faulty, param_space=_stall_space(marker),
                     run_config=tune.RunConfig(storage_path=storage, verbose=0),
                     health=_health(), sweep_health=SWEEP)
        run.wait(timeout=180)
        stalled_at = Path(marker, "stall").stat().st_mtime
    restart = run.events(kind="restart")[0].time
    starts = run.events(kind="trial_started")
    resumed = starts[-1].time if len(starts) > 1 else float("nan")
    return restart - stalled_at, resumed - stalled_at


def stall_plain(storage: str, bound_s: float) -> bool:
    """Plain Tune (FailureConfig(max_failures=1)) on the same stall: was it restarted within
    ``bound_s`` seconds of the sweep's start?"""
    with tempfile.TemporaryDirectory() as marker:
        tuner = tune.Tuner(
            trainables.faulty, param_space=_stall_space(marker),
            tune_config=tune.TuneConfig(time_budget_s=bound_s),
            run_config=tune.RunConfig(storage_path=storage, verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=1)))
        grid = tuner.fit()
    result = grid[0]
    return bool(result.metrics.get("resumed_from", -1) >= 0)


def run_return_time(storage: str, n: int) -> tuple[list[float], list[float]]:
    """Seconds for rt.run() to return, vs constructing a plain Tuner (fit() blocks)."""
    ours, tuner_s = [], []
    space = {"kind": "healthy", "steps": 3, "step_s": 0.01}
    for _ in range(n):
        t0 = time.perf_counter()
        tune.Tuner(trainables.faulty, param_space=space,
                   run_config=tune.RunConfig(storage_path=storage, verbose=0))
        tuner_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run = rt.run(trainables.faulty, param_space=space,
                     run_config=tune.RunConfig(storage_path=storage, verbose=0),
                     health=_health(), sweep_health=SWEEP)
        ours.append(time.perf_counter() - t0)
        run.wait(timeout=120)
    return ours, tuner_s


def burst(config: dict) -> None:
    for i in range(config["n"]):
        tune.report({"loss": 1.0 / (i + 1), "memory_bytes": 1000 + i % 7})


FALSE_RESTARTS: list[int] = []


def sweep_seconds(storage: str, with_callback: bool, n: int) -> float:
    callbacks = ([rt.HealthCallback(_health(stall_timeout_s=60.0), sweep_health=SWEEP)]
                 if with_callback else [])
    tuner = tune.Tuner(
        tune.with_resources(burst, {"cpu": 0.5}),
        param_space={"n": n, "x": tune.grid_search([0, 1, 2, 3])},
        run_config=tune.RunConfig(storage_path=storage, verbose=0, callbacks=callbacks))
    t0 = time.perf_counter()
    tuner.fit()
    elapsed = time.perf_counter() - t0
    for callback in callbacks:
        FALSE_RESTARTS.append(len(callback.event_log.events(kind="restart")))
    return elapsed


def callback_cost_us(n: int) -> float:
    """Microseconds per on_trial_result call of the callback, in process."""
    from types import SimpleNamespace

    callback = rt.HealthCallback(_health(stall_timeout_s=60.0), sweep_health=SWEEP)
    trial = SimpleNamespace(trial_id="t", status="RUNNING", last_result={},
                            latest_checkpoint_result=None)
    callback._bind = lambda trials: None  # no controller in process
    callback._controller = object()
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    results = [{"training_iteration": i, "loss": 1.0 / i, "memory_bytes": 1000 + i % 7,
                "time_this_iter_s": 0.001} for i in range(1, n + 1)]
    t0 = time.perf_counter()
    for r in results:
        callback.on_trial_result(iteration=0, trials=[trial], trial=trial, result=r)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps, results = (1, 150) if args.quick else (2, 300)
    bound = 12.0 if args.quick else 20.0
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="bench_tune_")
    print(f"rayguard.tune benchmark (ray {ray.__version__}); shared, loaded 2-core machine: "
          "wall times are noisy")

    ours, tuner_s = run_return_time(storage, reps + 2)
    print(f"run() returns in      median {statistics.median(ours):.3f} s "
          f"(plain Tuner() constructor {statistics.median(tuner_s):.3f} s; Tuner.fit() "
          "blocks until the sweep ends)")

    detect, resume = zip(*[stall_ours(storage) for _ in range(reps)], strict=True)
    print(f"stall -> restart      median {statistics.median(detect):.2f} s, -> trial "
          f"running again {statistics.median(resume):.2f} s (stall_timeout_s="
          f"{STALL_TIMEOUT_S})")
    restarted = stall_plain(storage, bound)
    print(f"plain Tune, same stall: {'restarted' if restarted else 'NOT detected'} within "
          f"{bound:.0f} s (FailureConfig(max_failures=1))")

    cost = callback_cost_us(20000)
    plain = [sweep_seconds(storage, False, results) for _ in range(reps)]
    guarded = [sweep_seconds(storage, True, results) for _ in range(reps)]
    n_results = 4 * results
    p, g = statistics.median(plain), statistics.median(guarded)
    per_result_us = p / n_results * 1e6
    print(f"callback cost         {cost:.1f} us per result in process = "
          f"{cost / per_result_us:.2%} of Tune's {per_result_us:.0f} us per result")
    print(f"sweep of {n_results} results: plain {p:.2f} s, with HealthCallback {g:.2f} s "
          f"(ratio {g / p:.3f}; wall-clock noise on this machine dominates); restarts of these "
          f"healthy trials: {sum(FALSE_RESTARTS)}")
    threading.Event().wait(0.1)
    ray.shutdown()


if __name__ == "__main__":
    main()
