"""A driver that has not imported torch calls rayguard.tune.run() (run as a script by
tests/ray/test_tune_cold_driver.py and tests/benchmarks/bench_tune_return.py).

    python tune_cold_driver.py GCS_ADDRESS STORAGE_DIR [--sync-register]

Prints one JSON line: where the serializers were registered, whether they are registered
once the sweep ends, whether torch was loaded before run(), and the seconds run() took
(and a plain Tuner's construction, the baseline). ``--sync-register`` instead times a
synchronous register_tensor_serializers(), what run() did on the caller's thread before.
"""

from __future__ import annotations

import json
import sys
import threading
import time


def trainable(config: dict) -> None:
    from ray import tune

    tune.report({"loss": 1.0})


def main() -> None:
    address, storage = sys.argv[1], sys.argv[2]
    import ray
    from ray import tune

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    import rayguard.serialization
    import rayguard.tune as rt

    torch_before = "torch" in sys.modules
    if "--sync-register" in sys.argv:
        t0 = time.perf_counter()
        rayguard.serialization.register_tensor_serializers()
        print(json.dumps({"torch_before": torch_before, "sync_register_s": time.perf_counter() - t0}))
        return
    calls: list[str] = []
    original = rayguard.serialization.register_tensor_serializers

    def spy(*args: object, **kwargs: object) -> None:
        calls.append(threading.current_thread().name)
        original(*args, **kwargs)

    rayguard.serialization.register_tensor_serializers = spy  # type: ignore[assignment]
    t0 = time.perf_counter()
    tune.Tuner(trainable, run_config=tune.RunConfig(storage_path=storage, name="plain"))
    plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = rt.run(tune.with_resources(trainable, {"cpu": 0.5}),
                 run_config=tune.RunConfig(storage_path=storage, name="cold", verbose=0))
    run_s = time.perf_counter() - t0
    run.wait(timeout=240)
    deadline = time.monotonic() + 120
    while not rayguard.serialization.is_registered() and time.monotonic() < deadline:
        time.sleep(0.1)
    print(json.dumps({"torch_before": torch_before, "calls": calls, "run_s": run_s,
                      "plain_tuner_s": plain_s,
                      "registered": rayguard.serialization.is_registered()}))


if __name__ == "__main__":
    main()
