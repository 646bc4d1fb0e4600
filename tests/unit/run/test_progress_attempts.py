"""The driver's progress line keeps each attempt's figures apart: the step shown is the running
attempt's own, steps/s compare two points of one attempt, the checkpoint is this fit()'s.
On the coordinator's class itself (no Ray) and the printer's pure step."""

from __future__ import annotations

from rayguard.observe.progress import next_line
from rayguard.run.coordinator import RunCoordinator


def coordinator(tmp_path) -> RunCoordinator:
    return RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})


def commit(c: RunCoordinator, step: int) -> None:
    c.record({"kind": "checkpoint_committed", "detail": "", "step": step, "time": 0.0})


def test_the_checkpoint_shown_is_not_newer_than_the_step_shown(tmp_path):
    # Rank 0 sends its step at most every 2 s; a fast run commits meanwhile (measured on the
    # quickstart: "step 0 | ... | checkpoint step 29").
    c = coordinator(tmp_path)
    c.open_attempt("restart")
    c.progress({"step": 0, "metrics": {"loss": 4.2}, "time": 1.0, "world_size": 2})
    commit(c, 29)
    commit(c, 59)
    line, _ = next_line(None, c.get_progress())
    assert line.startswith("step 0 |") and line.endswith("no checkpoint yet")
    c.progress({"step": 45, "metrics": {"loss": 0.1}, "time": 3.0, "world_size": 2})
    assert c.get_progress()["checkpoint_step"] == 29
    c.progress({"step": 59, "metrics": {"loss": 0.05}, "time": 4.0, "world_size": 2})
    assert c.get_progress()["checkpoint_step"] == 59


def test_after_a_restart_the_step_shown_is_the_new_attempts(tmp_path):
    c = coordinator(tmp_path)
    c.open_attempt("restart")
    c.progress({"step": 68, "metrics": {"loss": 0.2}, "time": 10.0, "world_size": 2})
    commit(c, 69)
    c.open_attempt("restart")  # the group died; attempt 1 resumes from checkpoint 69
    view = c.get_progress()
    assert view["attempt"] == 1 and "step" not in view  # not attempt 0's step 68
    assert view["metrics"] == {"loss": 0.2}  # still RobustTrainer.last_metrics
    assert next_line((0, 68, 10.0), view) is None
    c.progress({"step": 70, "metrics": {"loss": 0.19}, "time": 30.0, "world_size": 2})
    line, printed = next_line((0, 68, 10.0), c.get_progress())
    assert line.startswith("step 70 |") and "attempt 1" in line
    assert line.endswith("checkpoint step 69")  # the run's checkpoint, from attempt 0
    assert printed == (1, 70, 30.0)


def test_steps_per_second_are_measured_within_one_attempt():
    # Attempt 1 restarted at step 70 after a 20 s pause: no rate across the restart ...
    line, printed = next_line((0, 68, 10.0), {"step": 70, "time": 30.0, "attempt": 1})
    assert "steps/s" not in line
    # ... and the next line of the same attempt measures from its own first point.
    line, _ = next_line(printed, {"step": 80, "time": 32.0, "attempt": 1})
    assert "5 steps/s" in line


def test_the_same_step_twice_prints_once():
    assert next_line((1, 70, 30.0), {"step": 70, "time": 31.0, "attempt": 1}) is None
    line, _ = next_line((0, 70, 30.0), {"step": 70, "time": 31.0, "attempt": 1})
    assert line.startswith("step 70")


def test_a_restart_says_the_last_step_rank_0_reported_in_the_failed_attempt(tmp_path):
    c = coordinator(tmp_path)
    c.open_attempt("restart")
    c.progress({"step": 41, "metrics": {}, "time": 12.5, "world_size": 2})
    restart = {"kind": "restart", "detail": "", "attempt": 0, "time": 20.0}
    c.record(restart)
    assert restart["last_step"] == 41 and restart["last_step_time"] == 12.5
    c.open_attempt("restart")  # attempt 1 has reported nothing yet: its restart says nothing
    quiet = {"kind": "restart", "detail": "", "attempt": 1, "time": 30.0}
    c.record(quiet)
    assert "last_step" not in quiet
