"""Which path a failure's recovery takes (rayguard/health/recovery.py::plan_recovery_path,
pure): the decision table, one case per row and the orders between rows, and the ``restart``
event's fields each path gives."""

from __future__ import annotations

import pickle

import pytest

from rayguard.health.recovery import (
    LIVE,
    REPLICA_GROUP,
    RESIZE,
    RESTART,
    ROLLBACK,
    LiveAttempt,
    RecoveryKind,
    RecoveryPath,
    plan_recovery_path,
    recovery_mode,
)

W = 16
EVERY = tuple(range(W))
UNSETTLED = LiveAttempt(1, (11,))
SETTLED = LiveAttempt(1, (11,), settled=True)

# (row, failed, mode, keyword arguments) -> (kind, ranks, a piece of fallback or None)
CASES = [
    ("1 in place", (), LIVE, {"in_place": True}, ROLLBACK, (), None),
    ("1 in place first, whatever failed", {3}, LIVE, {"in_place": True, "lost_nodes": ["n"]},
     ROLLBACK, (), None),
    ("2 no rank failed", (), LIVE, {}, RESTART, EVERY, None),
    ("2 no rank failed, torchft", (), REPLICA_GROUP, {}, RESTART, EVERY, None),
    ("3 restart mode", {1}, RESTART, {"live_attempt": UNSETTLED}, RESTART, EVERY, None),
    ("3 restart mode, a lost node", {1}, RESTART, {"lost_nodes": ["n"]}, RESTART, EVERY, None),
    ("4 survivors fail in a live attempt", {10, 12}, LIVE, {"live_attempt": UNSETTLED},
     RESTART, EVERY, "survivor(s) [10, 12] failed in it"),
    ("4 its replacement fails", {11}, LIVE, {"live_attempt": UNSETTLED}, RESTART, EVERY,
     "its replacement(s) [11] failed in it"),
    ("4 before every rank failed", range(W), LIVE, {"live_attempt": UNSETTLED}, RESTART, EVERY,
     "live attempt 1 (rank(s) [11] replaced) failed before its first commit"),
    ("4 before a lost node", {11}, LIVE, {"live_attempt": UNSETTLED, "lost_nodes": ["n"]},
     RESTART, EVERY, "live attempt 1"),
    ("5 every rank failed, live", range(W), LIVE, {}, RESTART, EVERY,
     f"every rank failed ({W}): there is no survivor to keep"),
    ("5 every rank failed after a settled attempt", range(W), LIVE,
     {"live_attempt": SETTLED}, RESTART, EVERY, "every rank failed"),
    ("5 every rank failed, torchft: no fallback", range(W), REPLICA_GROUP, {}, RESTART, EVERY,
     None),
    ("5b a rank already returned, live", {2}, LIVE, {"returned": [5, 4]}, RESTART, EVERY,
     "rank(s) [4, 5] already returned from the training function"),
    ("5b before 6 and 7: a lost node when a rank returned", {2}, LIVE,
     {"returned": [4], "lost_nodes": ["n"], "elastic": True}, RESTART, EVERY, "[4] already"),
    ("5b torchft: replica groups as before", {2}, REPLICA_GROUP, {"returned": [4]},
     REPLICA_GROUP, (2,), None),
    ("6 elastic, a lost node resizes", {2, 3}, LIVE,
     {"lost_nodes": ["f96b8a0123456789"], "elastic": True}, RESIZE, (2, 3), None),
    ("6 elastic, after a settled live attempt", {2}, LIVE,
     {"lost_nodes": ["n"], "elastic": True, "live_attempt": SETTLED}, RESIZE, (2,), None),
    ("4 before 6: an unsettled live attempt of an elastic run", {2}, LIVE,
     {"lost_nodes": ["n"], "elastic": True, "live_attempt": UNSETTLED}, RESTART, EVERY,
     "live attempt 1"),
    ("4 before 6: a grow in place that lost its new worker", {2}, LIVE,
     {"lost_nodes": ["n"], "elastic": True, "live_attempt": LiveAttempt(2, (), resized=(2, 3))},
     RESTART, EVERY, "attempt 2 (resized in place from 2 to 3 workers) failed before its first "
     "commit, rank(s) [2] failed in it"),
    ("5 before 6: every rank of an elastic run failed", range(W), LIVE,
     {"lost_nodes": ["n"], "elastic": True}, RESTART, EVERY, "every rank failed"),
    ("6 elastic needs a lost node", {2}, LIVE, {"elastic": True}, LIVE, (2,), None),
    ("6 elastic needs live recovery", {2}, REPLICA_GROUP,
     {"lost_nodes": ["n"], "elastic": True}, REPLICA_GROUP, (2,), None),
    ("6 elastic needs live recovery, restart mode", {2}, RESTART,
     {"lost_nodes": ["n"], "elastic": True}, RESTART, EVERY, None),
    ("7 a lost node", {2}, LIVE, {"lost_nodes": ["f96b8a0123456789"]}, RESTART, EVERY,
     "node(s) f96b8a012345 of rank(s) [2] lost"),
    ("7 a lost node, not elastic said so", {2}, LIVE,
     {"lost_nodes": ["n"], "elastic": False}, RESTART, EVERY, "node(s) n of rank(s) [2] lost"),
    ("8 replica groups, a lost node is Ray's", {2}, REPLICA_GROUP, {"lost_nodes": ["n"]},
     REPLICA_GROUP, (2,), None),
    ("8 replica groups, a live attempt is no matter", {2, 0}, REPLICA_GROUP,
     {"live_attempt": UNSETTLED}, REPLICA_GROUP, (0, 2), None),
    ("9 live", {11}, LIVE, {}, LIVE, (11,), None),
    ("9 live again after a settled attempt", {4}, LIVE, {"live_attempt": SETTLED}, LIVE, (4,),
     None),
    ("9 a plain string mode", {4}, "live", {}, LIVE, (4,), None),
]


@pytest.mark.parametrize("failed, mode, kwargs, kind, ranks, fallback",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_decision_table(failed, mode, kwargs, kind, ranks, fallback) -> None:
    plan = plan_recovery_path(failed, W, mode=mode, attempt=7, **kwargs)
    assert (plan.kind, plan.ranks, plan.attempt) == (kind, ranks, 7)
    assert plan.reason
    if fallback is None:
        assert plan.fallback is None
    else:
        assert plan.fallback is not None and fallback in plan.fallback
        assert plan.fallback == plan.reason
    assert plan.alone == (kind in (LIVE, REPLICA_GROUP))


def test_an_in_place_rollback_needs_live_recovery() -> None:
    with pytest.raises(ValueError, match="live recovery, not mode 'restart'"):
        plan_recovery_path((), W, mode=RESTART, in_place=True)


def test_the_restart_events_fields_come_from_the_path() -> None:
    live = plan_recovery_path({11, 3}, W, mode=LIVE)
    assert live.event_fields() == {"path": "live", "ranks": [3, 11]}
    torchft = plan_recovery_path({2}, W, mode=REPLICA_GROUP)
    assert torchft.event_fields() == {"path": "replica_group", "ranks": [2]}
    plain = plan_recovery_path({2}, W, mode=RESTART)
    assert plain.event_fields() == {}  # a whole-group restart's event has no path
    fallback = plan_recovery_path({2}, W, mode=LIVE, lost_nodes=["n"])
    assert fallback.event_fields() == {"fallback": fallback.reason}
    in_place = plan_recovery_path((), W, mode=LIVE, in_place=True)
    assert in_place.event_fields() == {"path": "in_place"}
    resize = plan_recovery_path({2}, W, mode=LIVE, lost_nodes=["n"], elastic=True)
    assert resize.event_fields() == {"path": "resize"}  # its own resize event says the rest
    assert not resize.alone and "elastic policy chooses the new size" in resize.reason
    assert all(type(v) is not RecoveryKind for v in live.event_fields().values())


def test_a_path_is_plain_data() -> None:
    plan = RecoveryPath("live", (1,), "why", attempt=3)
    assert plan.kind is LIVE and str(plan.kind) == "live"
    assert pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises(ValueError, match="'sideways'"):
        RecoveryPath("sideways", (), "why")


@pytest.mark.parametrize("replica_groups, live, mode", [
    (False, False, RESTART), (False, True, RESTART), (True, False, REPLICA_GROUP),
    (True, True, LIVE)])
def test_the_mode_a_backend_allows(replica_groups, live, mode) -> None:
    assert recovery_mode(replica_groups=replica_groups, live=live) is mode
