"""Rank remapping policy: contiguity, determinism, survivor order, large worlds."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.elastic import WorkerSlot, plan_ranks
from rayguard.elastic.remap import (
    assignment_from_state,
    initial_order,
    slot_from_key,
    slot_key,
    slots_from_workers,
)
from rayguard.exceptions import ConfigError


def grid(nodes: int, per_node: int, prefix: str = "n") -> list[WorkerSlot]:
    return [WorkerSlot(f"{prefix}{n:04d}", i, (i,)) for n in range(nodes) for i in range(per_node)]


def test_first_attempt_follows_node_then_gpu_order() -> None:
    ws = [WorkerSlot("b", 1, (1,)), WorkerSlot("a", 0, (3,)), WorkerSlot("b", 0, (0,)), WorkerSlot("a", 1, (2,))]
    a = plan_ranks(ws)
    # node order: first appearance ("b" then "a"); inside a node: lowest GPU id
    assert [(s.node_id, s.gpu_ids) for s in a.slots] == [("b", (0,)), ("b", (1,)), ("a", (2,)), ("a", (3,))]
    assert a.previous_rank == [None] * 4 and not a.world_size_changed and a.previous_world_size is None


def test_shrink_compacts_in_order() -> None:
    first = plan_ranks(grid(4, 1))
    lost = first.slots[1]
    after = plan_ranks([s for s in first.slots if s != lost], first.ranks)
    assert after.previous_rank == [0, 2, 3]
    assert after.world_size_changed and after.world_size == 3 and after.previous_world_size == 4


def test_shrink_from_the_top_keeps_ranks() -> None:
    first = plan_ranks(grid(4, 2))
    after = plan_ranks(first.slots[:6], first.ranks)
    assert after.previous_rank == list(range(6))


def test_grow_keeps_survivors_and_appends() -> None:
    first = plan_ranks(grid(2, 2))
    new = grid(1, 2, prefix="m")
    after = plan_ranks(first.slots + new, first.ranks)
    assert after.previous_rank == [0, 1, 2, 3, None, None]
    assert after.slots[4:] == new


def test_replace_fills_the_hole() -> None:
    first = plan_ranks(grid(4, 1))
    new = WorkerSlot("zzz")
    workers = [first.slots[0], new, first.slots[2], first.slots[3]]
    after = plan_ranks(workers, first.ranks)
    assert after.previous_rank == [0, None, 2, 3] and after.ranks[new] == 1
    assert not after.world_size_changed


def test_state_round_trip() -> None:
    a = plan_ranks(grid(3, 2))
    assert assignment_from_state(a.to_state()) == a.ranks
    s = WorkerSlot("node/with/slashes", 3, (4, 5))
    assert slot_from_key(slot_key(s)) == s
    assert slot_from_key(slot_key(WorkerSlot("x"))) == WorkerSlot("x")


def test_slots_from_workers_local_index_per_node_id() -> None:
    slots = slots_from_workers([("a", []), ("b", []), ("a", []), ("b", [])])
    assert slots == [WorkerSlot("a", 0), WorkerSlot("b", 0), WorkerSlot("a", 1), WorkerSlot("b", 1)]
    gpu = slots_from_workers([("a", [3]), ("a", [1])])
    assert gpu == [WorkerSlot("a", 1, (3,)), WorkerSlot("a", 0, (1,))]


def test_errors() -> None:
    with pytest.raises(ConfigError, match="no workers"):
        plan_ranks([])
    with pytest.raises(ConfigError, match="duplicate"):
        plan_ranks([WorkerSlot("a"), WorkerSlot("a")])
    with pytest.raises(ConfigError, match="previous ranks"):
        plan_ranks([WorkerSlot("a")], {WorkerSlot("a"): 2})
    with pytest.raises(ConfigError, match="slot_key"):
        slot_from_key("garbage")


def test_large_world_4096_ranks_512_nodes() -> None:
    first = plan_ranks(grid(512, 8))
    assert sorted(first.ranks.values()) == list(range(4096))
    rng = random.Random(7)
    lost_nodes = {f"n{n:04d}" for n in rng.sample(range(512), 37)}
    survivors = [s for s in first.slots if s.node_id not in lost_nodes]
    newcomers = grid(20, 8, prefix="m")
    workers = survivors + newcomers
    rng.shuffle(workers)  # input order of survivors does not matter
    after = plan_ranks(workers, first.ranks)
    assert sorted(after.ranks.values()) == list(range(len(workers)))
    prev = [p for p in after.previous_rank if p is not None]
    assert prev == sorted(prev) and len(prev) == len(survivors)
    assert {after.slots[r] for r, p in enumerate(after.previous_rank) if p is None} == set(newcomers)


@st.composite
def resize(draw: st.DrawFn) -> tuple[list[WorkerSlot], list[WorkerSlot]]:
    universe = [WorkerSlot(f"n{n}", i, ()) for n in range(12) for i in range(3)]
    before = draw(st.lists(st.sampled_from(universe), min_size=1, max_size=20, unique=True))
    after = draw(st.lists(st.sampled_from(universe), min_size=1, max_size=20, unique=True))
    return before, after


@settings(max_examples=300, deadline=None)
@given(resize())
def test_policy_properties(case: tuple[list[WorkerSlot], list[WorkerSlot]]) -> None:
    before, after = case
    first = plan_ranks(before)
    again = plan_ranks(after, first.ranks)
    n = len(after)
    # contiguous, one rank per worker, slots/ranks/previous_rank consistent
    assert sorted(again.ranks.values()) == list(range(n))
    assert [again.ranks[s] for s in again.slots] == list(range(n))
    assert again.world_size_changed == (len(before) != n)
    # survivors keep their relative order and never move up
    surv = [(first.ranks[s], again.ranks[s]) for s in after if s in first.ranks]
    surv.sort()
    assert [r for _, r in surv] == sorted(r for _, r in surv)
    assert all(new <= old for old, new in surv)
    # a survivor keeps its rank whenever the smaller world forces nothing else
    for i, (old, new) in enumerate(surv):
        assert new == min(old, n - len(surv) + i)
    # previous_rank is exactly the survivors' old ranks
    assert {(p, r) for r, p in enumerate(again.previous_rank) if p is not None} == set(surv)
    # new workers take the lowest free ranks, in initial order
    newcomers = [s for s in initial_order(after) if s not in first.ranks]
    free = sorted(set(range(n)) - {r for _, r in surv})
    assert [again.ranks[s] for s in newcomers] == free
    # survivors' ranks do not depend on the order workers are listed in
    shuffled = plan_ranks(list(reversed(after)), first.ranks)
    assert all(shuffled.ranks[s] == again.ranks[s] for s in after if s in first.ranks)
