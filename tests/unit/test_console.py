"""What a person sees: RAYGUARD_LOG_LEVEL, Ray's per-report line hidden, the progress line."""

from __future__ import annotations

import logging

import pytest

from rayguard import logs
from rayguard.observe.progress import event_line, progress_line


@pytest.mark.parametrize(("value", "level"), [("DEBUG", logging.DEBUG), ("warning", logging.WARNING),
                                              (None, logging.INFO)])
def test_log_level_is_read_from_the_environment(monkeypatch, value, level):
    if value is None:
        monkeypatch.delenv("RAYGUARD_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("RAYGUARD_LOG_LEVEL", value)
    assert logs.configure_logging().level == level


def test_a_bad_log_level_falls_back_to_info_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv("RAYGUARD_LOG_LEVEL", "LOUD")
    with caplog.at_level(logging.WARNING, logger="rayguard"):
        assert logs.log_level() == logging.INFO
    assert "RAYGUARD_LOG_LEVEL='LOUD'" in caplog.text and "Fix:" in caplog.text


def test_rays_per_report_line_is_hidden_unless_debug(monkeypatch):
    from rayguard._ray.core import train_context_logger

    target = train_context_logger()
    monkeypatch.setattr(target, "filters", [])
    record = logging.LogRecord(target.name, logging.INFO, __file__, 1,
                               "Reporting training result 3: TrainingReport(...)", None, None)
    other = logging.LogRecord(target.name, logging.INFO, __file__, 1, "something else", None, None)
    monkeypatch.setenv("RAYGUARD_LOG_LEVEL", "DEBUG")
    logs.quiet_ray_reports()
    assert target.filter(record)
    monkeypatch.setenv("RAYGUARD_LOG_LEVEL", "INFO")
    logs.quiet_ray_reports()
    logs.quiet_ray_reports()  # idempotent
    assert len(target.filters) == 1
    assert not target.filter(record) and target.filter(other)


def test_progress_line_is_compact_and_names_what_matters():
    line = progress_line({"step": 40, "metrics": {"step": 40, "loss": 0.05521, "acc": 0.9},
                          "attempt": 1, "world_size": 2, "checkpoint_step": 39}, 12.34)
    assert line == "step 40 | loss 0.05521 | 12.3 steps/s | attempt 1 | 2 worker(s) | checkpoint step 39"
    line = progress_line({"step": 0, "metrics": {"acc": 0.5}, "attempt": 0}, None)
    assert line == "step 0 | acc 0.5 | attempt 0 | no checkpoint yet"


def test_progress_line_counts_in_the_loops_own_unit():
    # a ray.train.report loop that reports {"loss", "epoch"}: its step is the epoch
    line = progress_line({"step": 140, "unit": "epoch", "metrics": {"loss": 0.5, "epoch": 140},
                          "attempt": 1, "world_size": 2, "checkpoint_step": 139}, 0.5)
    assert line == ("epoch 140 | loss 0.5 | 0.5 epochs/s | attempt 1 | 2 worker(s) | "
                    "checkpoint epoch 139")
    line = progress_line({"step": 7, "unit": "global_step", "metrics": {}, "attempt": 0}, None)
    assert line.startswith("step 7 | ")
    line = progress_line({"step": 7, "unit": "report", "metrics": {}, "attempt": 0}, 2.0)
    assert line.startswith("report 7 | 2 reports/s | ")


def test_event_line_is_one_line():
    line = event_line({"kind": "worker_died", "attempt": 0, "rank": 1, "step": None,
                       "detail": "rank 1 failed: injected kill (RAYGUARD_FAULTS)"})
    assert line == "worker_died (attempt 0, rank 1): rank 1 failed: injected kill (RAYGUARD_FAULTS)"
