"""The sweep's event file holds every event the handle shows, ``sweep_finished`` included,
and ``rayguard.tune.read`` returns them."""

from __future__ import annotations

from ray import tune

import rayguard.tune as rt


def _quick(config: dict) -> None:
    for step in range(3):
        tune.report({"loss": 1.0 / (step + 1), "step": step})


def test_event_file_matches_the_handle(ray_local, tmp_path):
    run = rt.run(tune.with_resources(_quick, {"cpu": 0.5}),
                 param_space={"x": tune.grid_search([1, 2])},
                 run_config=tune.RunConfig(storage_path=str(tmp_path), name="events", verbose=0))
    run.wait(timeout=240)
    in_memory = [(e.kind, e.trial_id, e.detail) for e in run.events()]
    on_disk = [(e.kind, e.trial_id, e.detail) for e in rt.read(run.experiment_path)]
    assert in_memory[-1][0] == "sweep_finished"
    assert on_disk == in_memory
