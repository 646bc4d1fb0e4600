"""The replay is worded in the run's step unit: a ``ray.train.report`` loop that counts epochs
reads "3 epochs replayed", one without a step key "3 reports replayed"; steps otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from rayguard.events import make_event
from rayguard.observe.compact_log import CompactLog
from rayguard.observe.goodput import goodput, step_unit_of
from rayguard.observe.goodput_table import counted, format_goodput, headline, noun
from rayguard.observe.report import _restart_table, summary_rows

T0 = 1_700_000_000.0


def ev(t: float, kind: str, attempt: int | None = None, **fields: Any) -> dict[str, Any]:
    event = make_event(kind, kind, attempt=attempt, **fields)
    event["time"] = T0 + t
    return event


def epochs_redone(unit: str | None) -> list[dict[str, Any]]:
    """Epochs 0-4 reported, the checkpoint of epoch 1 committed, a kill at epoch 4, the resume
    from epoch 1: epochs 2-4 again (3 replayed)."""
    tag = {} if unit is None else {"step_unit": unit}
    return [ev(0, "start"), ev(1, "attempt_started", 0),
            ev(2, "steps", 0, rank=0, first_step=0, last_step=0, step=0, first_time=T0 + 2,
               step_time_sum_s=0.0, intervals=0, reports=1),
            ev(5, "checkpoint_committed", 0, step=1, blocked_s=0.5, **tag),
            ev(12, "steps", 0, rank=0, first_step=1, last_step=4, step=4, first_time=T0 + 3,
               step_time_sum_s=8.0, intervals=4, reports=4),
            ev(13, "worker_died", 0, rank=1), ev(14, "restart", 0),
            ev(16, "attempt_started", 1), ev(17, "restored", 1, step=1, **tag),
            ev(18, "steps", 1, rank=0, first_step=2, last_step=2, step=2, first_time=T0 + 18,
               step_time_sum_s=0.0, intervals=0, reports=1),
            ev(30, "steps", 1, rank=0, first_step=3, last_step=6, step=6, first_time=T0 + 19,
               step_time_sum_s=8.0, intervals=4, reports=4),
            ev(31, "finished")]


@pytest.mark.parametrize(("n", "unit", "words"), [
    (3, "epoch", "3 epochs"), (1, "epoch", "1 epoch"), (2, "report", "2 reports"),
    (26, "step", "26 steps"), (2, "global_step", "2 steps"),
    (4, "training_iteration", "4 iterations"), (0, "something new", "0 steps"),
])
def test_a_count_is_worded_in_its_unit(n, unit, words):
    assert counted(n, unit) == words


def test_the_default_unit_is_steps():
    assert counted(5) == "5 steps" and noun("unknown") == "step"


def test_the_goodput_reads_the_unit_the_events_record():
    assert step_unit_of([{"kind": "start"}]) == "step"
    assert step_unit_of([{"step_unit": "report"}, {"step_unit": "epoch"}]) == "epoch"
    g = goodput(epochs_redone("epoch"))
    assert g.replayed_steps == 3 and g.step_unit == "epoch"
    assert g.to_dict()["step_unit"] == "epoch"  # what --goodput --json and the report carry
    assert goodput(epochs_redone(None)).step_unit == "step"


def test_the_compact_log_keeps_the_unit_for_events_goodput():
    log = CompactLog()  # what ``rayguard events --goodput`` folds the log into
    for e in epochs_redone("epoch"):
        log.add(e)
    assert goodput(log.events()).step_unit == "epoch"


def test_the_headline_says_epochs_replayed():
    g = goodput(epochs_redone("epoch"))
    assert "3 epochs replayed" in headline(g)
    assert "3 epochs replayed" in format_goodput(g)
    assert "3 steps replayed" in headline(goodput(epochs_redone(None)))
    assert "3 reports replayed" in headline(goodput(epochs_redone("report")))


def test_the_report_words_the_replay_in_the_unit():
    rows = dict(summary_rows({"replayed_steps": 3, "mean_step_s": 2.0}, "epoch"))
    assert "3 epochs replayed" in rows["time lost to failures"]
    assert "1 step replayed" in dict(summary_rows({"replayed_steps": 1}))["time lost to failures"]
    data = {"restarts": [], "goodput": {"step_unit": "epoch"}}
    assert _restart_table(data).startswith('<p class="restarts none">')  # no rows: no header
    row = {"attempt": 0, "cause": "kill", "failure_time": 1.0, "cost_s": 2.0, "detection_s": 0.5,
           "restored_step": 1, "replayed_steps": 3, "fallback": False}
    table = _restart_table({**data, "restarts": [row]})
    assert "replayed epochs" in table and "resumed from epoch" in table
