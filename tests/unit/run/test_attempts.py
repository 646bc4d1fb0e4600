"""The run's attempts have one owner (rayguard/run/attempts.py): every opening is numbered
there and returned as what it opened; the coordinator's ``open_attempt`` is the one door,
and its live opening leaves the survivors' notice."""

from __future__ import annotations

import pickle

import pytest

from rayguard.health.live import live_key, opened_key
from rayguard.health.recovery import LIVE, REPLICA_GROUP, RESIZE, RESTART, ROLLBACK
from rayguard.run.attempts import Attempt, Attempts
from rayguard.run.coordinator import RunCoordinator


def test_each_opening_is_numbered_in_turn_and_returned() -> None:
    attempts = Attempts()
    assert attempts.latest is None and attempts.current == 0
    first = attempts.open(RESTART, now=10.0)
    live = attempts.open("live", replaced=[5, 2, 5], now=11.0)
    rollback = attempts.open(ROLLBACK, now=12.0)
    assert first == Attempt(0, RESTART, (), 10.0)
    assert live == Attempt(1, LIVE, (2, 5), 11.0)
    assert rollback == Attempt(2, ROLLBACK, (), 12.0)
    assert attempts.latest == rollback and attempts.current == 2
    assert attempts.get(1) == live and attempts.get(3) is None and attempts.get(-1) is None
    assert pickle.loads(pickle.dumps(live)) == live  # it crosses Ray processes


def test_only_a_live_attempt_replaces_ranks() -> None:
    attempts = Attempts()
    with pytest.raises(ValueError, match="replaces at least one rank"):
        attempts.open(LIVE)
    with pytest.raises(ValueError, match="only a live attempt"):
        attempts.open(RESTART, replaced=[1])
    with pytest.raises(ValueError, match="'sideways'"):
        attempts.open("sideways")
    assert attempts.latest is None  # a refused opening opens nothing


def test_a_resize_attempt_drops_ranks_or_none() -> None:
    attempts = Attempts()
    attempts.open(RESTART, now=1.0)
    shrink = attempts.open(RESIZE, replaced=[7, 6, 2, 6], now=2.0)
    grow = attempts.open("resize", now=3.0)
    assert shrink == Attempt(1, RESIZE, (2, 6, 7), 2.0)
    assert grow == Attempt(2, RESIZE, (), 3.0)  # a grow drops no rank
    assert attempts.latest == grow and attempts.current == 2
    assert pickle.loads(pickle.dumps(shrink)) == shrink


@pytest.mark.parametrize("kind", [RESTART, ROLLBACK, REPLICA_GROUP])
def test_other_kinds_still_refuse_replaced_ranks(kind) -> None:
    attempts = Attempts()
    with pytest.raises(ValueError, match="only a live attempt replaces ranks alone"):
        attempts.open(kind, replaced=[1])
    assert attempts.latest is None


def test_the_coordinator_opens_a_resize_with_its_notice(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt(RESTART)
    resize = {"old_world_size": 4, "world_size": 3, "direction": "shrink"}
    opened = c.open_attempt(RESIZE, 0, [3], "resized in place", resize)
    assert (opened.number, opened.kind, opened.replaced) == (1, RESIZE, (3,))
    notice = c.get(live_key(0))
    assert notice == c.get(opened_key(1)) == {"attempt": 1, "ranks": [3], "at": opened.opened_at,
                                              "detail": "resized in place", "resize": resize}
    grow = c.open_attempt(RESIZE, 1, [], "grown", {"old_world_size": 3, "world_size": 4})
    assert grow.replaced == () and c.get(live_key(1))["resize"]["world_size"] == 4
    with pytest.raises(ValueError, match=r"open_attempt\(RESIZE\): name the failed attempt"):
        c.open_attempt(RESIZE, None, [1])
    assert c.latest_attempt() == grow


def test_a_live_notice_says_no_resize(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt(RESTART)
    c.open_attempt(LIVE, 0, [2], "rank 2 replaced", {})  # an empty resize is none
    assert "resize" not in c.get(live_key(0))


def test_present_says_which_facts_are_there(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.put("resize:left:0:1", True)
    c.put("resize:left:0:3", {"at": 1})
    assert c.present(["resize:left:0:0", "resize:left:0:1", "resize:left:0:3"]) == [
        "resize:left:0:1", "resize:left:0:3"]
    assert c.present([]) == []


def test_the_coordinator_opens_every_kind_through_its_owner(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    assert c.latest_attempt() is None and c.attempt() == 0
    start = c.open_attempt(RESTART)
    rollback = c.open_attempt("in_place")
    live = c.open_attempt(LIVE, rollback.number, [3], "rank 3 replaced")
    assert [a.number for a in (start, rollback, live)] == [0, 1, 2]
    assert c.latest_attempt() == live and c.attempt() == 2
    notice = c.get(live_key(1))
    assert notice == c.get(opened_key(2)) == {"attempt": 2, "ranks": [3], "at": live.opened_at,
                                              "detail": "rank 3 replaced"}
    assert c.get(live_key(0)) is None  # only the failed attempt's survivors are told


def test_a_live_opening_names_the_attempt_it_replaces(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt(RESTART)
    with pytest.raises(ValueError, match="name the failed attempt"):
        c.open_attempt(LIVE, None, [1])
    assert c.latest_attempt().number == 0


def test_an_attempts_start_time_reaches_its_attempt_started_event(tmp_path) -> None:
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    opened = c.open_attempt(RESTART)
    event = {"kind": "attempt_started", "attempt": 0, "time": opened.opened_at + 5,
             "detail": "x"}
    c.record(event)
    assert event["group_start_time"] == opened.opened_at
    unknown = {"kind": "attempt_started", "attempt": 4, "time": 1.0, "detail": "x"}
    c.record(unknown)
    assert "group_start_time" not in unknown
