"""Resizing an elastic run in place (rayguard/elastic/in_place.py, pure): every row of
plan_resize's table, the plan's rank map and event fields, each worker's place in the resized
group, and the notice the workers read it from."""

from __future__ import annotations

import dataclasses

import pytest

from rayguard.elastic.in_place import (
    GROW,
    SHRINK,
    RankPlace,
    ResizeInput,
    ResizePlan,
    go_wait_s,
    is_resize,
    place_of,
    places,
    plan_resize,
)


def plan(old: int, new: int, **kwargs) -> ResizePlan:
    return plan_resize(ResizeInput(old_world=old, new_world=new, **kwargs))


# -- plan_resize's table: the restarts, one row each, with their reason --------------------
RESTARTS = [
    ("1 live recovery off", 4, 3, {"failed": frozenset({1}), "live": False},
     "live recovery is off (GuardConfig(recovery='restart'))"),
    ("1 a fixed-size run", 4, 3, {"failed": frozenset({1}), "elastic": False},
     "a fixed-size run is not resized"),
    ("1 live off is said before fixed size", 4, 3, {"live": False, "elastic": False},
     "live recovery is off"),
    ("2 the running live attempt failed", 4, 3,
     {"failed": frozenset({1}), "live_attempt_failed": "live attempt 2 failed before its commit"},
     "live attempt 2 failed before its commit"),
    ("2 before the same size", 4, 4, {"live_attempt_failed": "attempt 5 failed"},
     "attempt 5 failed"),
    ("3 the same size", 4, 4, {"failed": frozenset({1})},
     "the elastic policy kept 4 workers: not a resize"),
    ("4 a failed rank's node is still up", 4, 3,
     {"failed": frozenset({1}), "lost_only": False},
     "rank(s) [1] failed on nodes that are still up: not a lost node"),
    ("5 too few survivors", 4, 3, {"failed": frozenset({0, 1})},
     "2 survivor(s) cannot fill 3 ranks without new workers"),
    ("7 a grow while ranks failed", 2, 4,
     {"failed": frozenset({0}), "free_bundles": (2, 3)},
     "rank(s) [0] failed while the group grows"),
    ("8 a grow past the free bundles", 2, 4, {"free_bundles": (3,)},
     "growing from 2 to 4 needs 2 free placement-group bundle(s), the group has 1"),
    ("8 a grow with no free bundle", 3, 4, {},
     "needs 1 free placement-group bundle(s), the group has 0"),
]


@pytest.mark.parametrize("old, new, kwargs, reason", [c[1:] for c in RESTARTS],
                         ids=[c[0] for c in RESTARTS])
def test_a_resize_that_cannot_be_made_in_place_restarts_with_its_reason(
        old, new, kwargs, reason) -> None:
    got = plan(old, new, **kwargs)
    assert not got.in_place
    assert reason in got.reason
    assert (got.old_world, got.new_world) == (old, new)
    assert got.keep == () and got.retire == () and got.bundles == () and got.added == 0
    assert got.lost == tuple(sorted(kwargs.get("failed", ())))


def test_row_7_a_lost_nodes_shrink_keeps_the_survivors_in_their_old_order() -> None:
    got = plan(4, 3, failed=frozenset({1}))
    assert got.in_place and got.reason == ""
    assert got.direction == SHRINK
    assert got.keep == (0, 2, 3) and got.lost == (1,) and got.retire == ()
    assert got.bundles == () and got.added == 0


def test_row_7_survivors_beyond_a_rounded_down_size_are_stopped_highest_first() -> None:
    # 8 workers, a node of ranks 2 and 3 lost; the policy rounds 6 down to 4
    got = plan(8, 4, failed=frozenset({3, 2}))
    assert got.in_place
    assert got.keep == (0, 1, 4, 5) and got.lost == (2, 3) and got.retire == (6, 7)


def test_row_7_with_as_many_survivors_as_the_new_size() -> None:
    got = plan(4, 2, failed=frozenset({0, 3}))
    assert got.in_place and got.keep == (1, 2) and got.retire == ()


def test_row_4_a_shrink_with_no_rank_to_drop_restarts() -> None:
    got = plan(4, 2)  # no rank to drop: stopping rank 3 would be a guess
    assert not got.in_place and got.keep == () and got.retire == ()
    assert "no worker on a lost or quarantined node" in got.reason


def test_failed_ranks_outside_the_group_are_ignored() -> None:
    got = plan(4, 3, failed=frozenset({-1, 1, 4, 9}))
    assert got.in_place and got.lost == (1,) and got.keep == (0, 2, 3)


def test_row_10_a_grow_keeps_every_rank_and_takes_the_lowest_free_bundles() -> None:
    got = plan(2, 4, free_bundles=(7, 3, 5))
    assert got.in_place and got.direction == GROW
    assert got.keep == (0, 1) and got.lost == () and got.retire == ()
    assert got.bundles == (3, 5) and got.added == 2


def test_row_10_a_grow_with_exactly_the_free_bundles_it_needs() -> None:
    got = plan(3, 4, free_bundles=(3,))
    assert got.in_place and got.bundles == (3,) and got.keep == (0, 1, 2)


def test_a_shrink_needs_no_free_bundle_and_a_grow_ignores_lost_only() -> None:
    assert plan(4, 3, failed=frozenset({2}), free_bundles=()).in_place
    assert plan(2, 3, lost_only=False, free_bundles=(2,)).in_place


# -- the plan as data ----------------------------------------------------------------------
def test_the_rank_map_of_a_shrink_says_none_for_lost_and_stopped_ranks() -> None:
    got = plan(6, 3, failed=frozenset({1}))
    assert got.keep == (0, 2, 3) and got.retire == (4, 5)
    assert got.rank_map() == {0: 0, 1: None, 2: 1, 3: 2, 4: None, 5: None}


def test_the_rank_map_of_a_grow_keeps_every_rank() -> None:
    assert plan(3, 5, free_bundles=(3, 4)).rank_map() == {0: 0, 1: 1, 2: 2}


def test_the_rank_map_of_a_restart_keeps_no_rank() -> None:
    assert plan(3, 3).rank_map() == {0: None, 1: None, 2: None}


def test_the_event_fields_of_a_resize_in_place() -> None:
    got = plan(8, 4, failed=frozenset({2, 3}))
    assert got.event_fields() == {
        "path": "live", "direction": "shrink", "old_world_size": 8, "new_world_size": 4,
        "rank_map": {"0": 0, "1": 1, "2": None, "3": None, "4": 2, "5": 3, "6": None,
                     "7": None},
        "lost_ranks": [2, 3], "retired_ranks": [6, 7], "added": 0}


def test_the_event_fields_of_a_grow_in_place() -> None:
    fields = plan(2, 3, free_bundles=(2,)).event_fields()
    assert fields["path"] == "live" and fields["direction"] == "grow"
    assert fields["added"] == 1 and fields["rank_map"] == {"0": 0, "1": 1}
    assert "fallback" not in fields


def test_the_event_fields_of_a_restart_say_the_fallback() -> None:
    fields = plan(4, 3, failed=frozenset({1}), lost_only=False).event_fields()
    assert fields["path"] == "restart" and fields["direction"] == "shrink"
    assert fields["lost_ranks"] == [1] and fields["retired_ranks"] == []
    assert fields["rank_map"] == {"0": None, "1": None, "2": None, "3": None}
    assert "not a lost node" in fields["fallback"]


# -- each worker's place --------------------------------------------------------------------
def test_places_on_one_node_are_its_local_ranks() -> None:
    assert places(["a", "a", "a"]) == [RankPlace(0, 3, 0, 3, 0), RankPlace(1, 3, 1, 3, 0),
                                       RankPlace(2, 3, 2, 3, 0)]


def test_places_on_several_nodes_count_node_ranks_in_order_of_first_appearance() -> None:
    got = places(["b", "b", "a", "a", "c"])
    assert [p.world_rank for p in got] == [0, 1, 2, 3, 4]
    assert {p.world_size for p in got} == {5}
    assert [p.local_rank for p in got] == [0, 1, 0, 1, 0]
    assert [p.local_world_size for p in got] == [2, 2, 2, 2, 1]
    assert [p.node_rank for p in got] == [0, 0, 1, 1, 2]


def test_places_of_interleaved_nodes() -> None:
    got = places(["x", "y", "x", "z", "y"])
    assert [(p.local_rank, p.local_world_size, p.node_rank) for p in got] == [
        (0, 2, 0), (0, 2, 1), (1, 2, 0), (0, 1, 2), (1, 2, 1)]


def test_no_worker_has_no_place() -> None:
    assert places([]) == []


def test_a_place_is_what_rays_distributed_context_holds() -> None:
    from ray.train.v2._internal.execution.context import DistributedContext

    place = RankPlace(world_rank=3, world_size=4, local_rank=1, local_world_size=2,
                      node_rank=1)
    assert place.as_dict() == {"world_rank": 3, "world_size": 4, "local_rank": 1,
                               "local_world_size": 2, "node_rank": 1}
    assert DistributedContext(**place.as_dict()) == DistributedContext(3, 4, 1, 2, 1)
    assert [f.name for f in dataclasses.fields(DistributedContext)] == list(place.as_dict())


# -- the go fact -------------------------------------------------------------------------
def test_place_of_reads_a_kept_ranks_place_from_the_go_fact() -> None:
    shrink = plan(4, 3, failed=frozenset({1}))  # new ranks 0, 1, 2 are old 0, 2, 3
    placed = places(["n0", "n1", "n1"])
    go = {"places": {str(old): placed[i].as_dict() for i, old in enumerate(shrink.keep)}}
    assert place_of(go, 3) == {"world_rank": 2, "world_size": 3, "local_rank": 1,
                               "local_world_size": 2, "node_rank": 1}
    assert place_of(go, 2)["local_world_size"] == 2  # type: ignore[index]
    assert place_of(go, 1) is None  # lost: no place
    assert place_of(go, 7) is None


def test_place_of_an_empty_go_fact_is_none() -> None:
    assert place_of(None, 0) is None
    assert place_of({}, 0) is None
    assert place_of({"places": None}, 0) is None


def test_is_resize_only_for_a_notice_that_says_resize() -> None:
    assert not is_resize(None)
    assert not is_resize({})
    assert not is_resize({"attempt": 1, "ranks": [3], "detail": "rank 3 replaced"})
    assert not is_resize({"attempt": 1, "resize": None})
    assert not is_resize({"attempt": 1, "resize": {}})
    assert is_resize({"attempt": 1, "resize": {"old_world_size": 4, "world_size": 3}})


# -- how long a kept worker waits for the resized group ------------------------------------
def test_a_kept_worker_waits_for_the_controllers_bounds_and_a_grow_for_its_new_processes() -> None:
    shrink = plan(4, 3, failed=frozenset({2}))
    grow = plan(2, 3, free_bundles=(2,))
    # every kept worker leaving, then the group placed: live_wait_s each
    assert shrink.go_within_s(30.0, 60.0) == 60.0
    # a grow's new processes start too: as long as Ray Train gives a worker group to start
    assert grow.go_within_s(30.0, 60.0) == 120.0
    assert grow.go_within_s(5.0, 45.0) == 55.0


@pytest.mark.parametrize(("bound", "expected"), [
    (120.0, 120.0), (90, 90.0),
    (10.0, 30.0),  # never below live_wait_s
    (None, 30.0), ("120", 30.0), (True, 30.0), (float("nan"), 30.0),  # not a bound
    (float("inf"), 86400.0), (10 ** 400, 86400.0),  # capped at a day
])
def test_the_wait_for_the_go_fact_is_the_notices_bound_never_below_live_wait_s(
        bound, expected) -> None:
    notice = {"attempt": 3, "resize": {"direction": "grow", "go_within_s": bound}}
    assert go_wait_s(notice, 30.0) == expected


def test_a_notice_without_a_bound_waits_live_wait_s() -> None:
    assert go_wait_s({"attempt": 3, "resize": {"direction": "shrink"}}, 30.0) == 30.0
    assert go_wait_s(None, 7.0) == 7.0 and go_wait_s({}, 7.0) == 7.0
