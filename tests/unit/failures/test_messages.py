"""The final error's lines and cause (rayguard.failures.messages.final_lines): a rank the
controller failed before its own error reached Ray is shown by its own error, and the user's
exception, not rayguard's mark, becomes the cause. The real-process twin:
tests/ray/test_crash_loop.py (whose run met this order of events once in CI)."""

from __future__ import annotations

from types import SimpleNamespace

from rayguard._ray.train import fail_workers, marked_failed
from rayguard.exceptions import PeersLostError
from rayguard.failures.messages import final_lines
from rayguard.health.crash_loop import FailureRecord


def record(rank, summary="ValueError: my bug"):
    return FailureRecord(rank=rank, attempt=2, error_type="builtins.ValueError",
                         origin="loop.py:33 in loop", step=2, commits=0, summary=summary)


def marked(*ranks, text="rank(s) [1] raised in attempt 2; the error reaches Ray after this poll"):
    """Ray's view of a poll where ``ranks`` were failed by the controller (the real mark)."""
    status = SimpleNamespace(worker_statuses={r: SimpleNamespace(error=None) for r in ranks})
    fail_workers(status, ranks, PeersLostError(text))
    return {r: s.error for r, s in status.worker_statuses.items()}


def test_a_rank_failed_before_its_error_reached_ray_shows_its_own_error_and_is_not_the_cause():
    failures = {0: ValueError("my bug"), **marked(1)}
    lines, rank = final_lines(failures, {0: record(0), 1: record(1)}, {}, 1, marked_failed)
    assert lines == ["[rank 0] ValueError: my bug", "[rank 1] ValueError: my bug"]
    assert rank == 0  # the verdict named rank 1, whose error in Ray's view is the mark


def test_the_verdicts_rank_is_the_cause_when_its_error_is_its_own():
    failures = {0: ValueError("my bug"), 1: ValueError("my bug")}
    lines, rank = final_lines(failures, {0: record(0), 1: record(1)}, {}, 1, marked_failed)
    assert rank == 1 and lines[1] == "[rank 1] ValueError: my bug"
    assert final_lines(failures, {}, {}, None, marked_failed)[1] == 0  # no verdict: the lowest


def test_a_mark_without_a_record_keeps_rayguards_text_and_a_kill_says_so():
    failures = {0: ValueError("my bug"), **marked(1, 2, text="restart the group")}
    kills = {2: {"bound": "step", "reason": "no step for 60 s"}}
    lines, rank = final_lines(failures, {0: record(0), 2: record(2)}, kills, 2, marked_failed)
    assert lines[1] == "[rank 1] PeersLostError: restart the group"
    assert lines[2].startswith("[rank 2] killed by rayguard: step bound")
    assert rank == 0
    only_marks = marked(0, 1, text="restart the group")
    assert final_lines(only_marks, {}, {}, 1, marked_failed)[1] == 1  # nothing better
