"""A rayguard.tune sweep watched from a loop: four trials, one of which goes NaN once.

    .venv/bin/python examples/tune_sweep.py

rayguard.tune.run returns at once; the loop prints each trial's state, restarts and last
loss while the sweep runs, and the NaN trial is restarted from its checkpoint before the
NaN (watch the "restart" event), then completes.
"""

import json
import os
import tempfile
import time
from pathlib import Path

import ray
from ray import tune

import rayguard
import rayguard.tune


def train_fn(config):
    step = 0
    checkpoint = tune.get_checkpoint()  # set when Tune (or rayguard) restores the trial
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            step = json.loads(Path(d, "state.json").read_text())["step"]
    while step < 20:
        step += 1
        time.sleep(0.2)
        loss = config["lr"] / step
        if config["lr"] == 0.3 and step == 8 and not os.path.exists(config["marker"]):
            Path(config["marker"]).touch()  # the fault fires once
            loss = float("nan")
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"step": step}))
            tune.report({"loss": loss, "step": step},
                        checkpoint=tune.Checkpoint.from_directory(d))


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    workdir = tempfile.mkdtemp(prefix="rayguard-tune-")
    run = rayguard.tune.run(
        tune.with_resources(train_fn, {"cpu": 0.5}),
        param_space={"lr": tune.grid_search([0.1, 0.2, 0.3, 0.4]),
                     "marker": os.path.join(workdir, "nan-fired")},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=workdir, name="sweep", verbose=0),
        health=rayguard.HealthConfig(stall_timeout_s=30, max_restarts=2),
    )
    print(f"sweep started in {run.experiment_path}")
    seen = 0
    while not run.done():
        time.sleep(1.0)
        for trial_id, s in sorted(run.status().items()):
            print(f"  {trial_id}  {s.state:10s} restarts={s.restarts} "
                  f"loss={s.last_metrics.get('loss')}")
        for event in run.events()[seen:]:
            if event.kind in ("unhealthy", "restart", "failed"):
                print(f"  EVENT {event.kind}: {event.detail}")
        seen = len(run.events())
    grid = run.wait()
    best = grid.get_best_result()
    print(f"best lr={best.config['lr']} loss={best.metrics['loss']:.4f}")
    print(f"events: {run.experiment_path}/rayguard_sweep_events.jsonl")
    ray.shutdown()


if __name__ == "__main__":
    main()
