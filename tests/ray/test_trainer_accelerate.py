"""An unchanged Hugging Face accelerate loop runs under RobustTrainer."""

import importlib.util
import json
import pathlib

from rayguard.testing.recorder import RecordReports, make_trainer, read_reports

_spec = importlib.util.spec_from_file_location(
    "accelerate_loop", pathlib.Path(__file__).parents[2] / "examples" / "accelerate_loop.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def test_accelerate_loop_runs_unchanged(ray_local, tmp_path):
    log = str(tmp_path / "reports.jsonl")
    make_trainer(example.train_fn, tmp_path, config={"epochs": 2},
                 callbacks=[RecordReports(log)]).fit()
    reports = read_reports(log)
    assert [[m["epoch"] for m in r] for r in reports] == [[0, 0], [1, 1]]
    # Accelerate saw the 2-process group Ray Train set up.
    assert all(m["processes"] == 2 for r in reports for m in r), json.dumps(reports)
