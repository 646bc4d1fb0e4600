"""The pure NUMA planner over simulated topologies."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.exceptions import ConfigError
from rayguard.placement.numa import NodePlan, WorkerRequest, plan_cluster, plan_node
from rayguard.placement.topology import Topology, topology_from_dict


def topo(node_cpus: list[str], gpu_nodes: list[int], distances: list[list[int]] | None = None,
         uuids: bool = False) -> Topology:
    nodes = [{"id": i, "cpus": c} for i, c in enumerate(node_cpus)]
    if distances:
        for n, row in zip(nodes, distances, strict=True):
            n["distances"] = row
    gpus = [{"index": i, "numa_node": n, **({"uuid": f"GPU-{i:04d}"} if uuids else {})}
            for i, n in enumerate(gpu_nodes)]
    return topology_from_dict({"numa_nodes": nodes, "gpus": gpus})


def req(rank: int, *gpus: int | str, cpus: float = 1) -> WorkerRequest:
    return WorkerRequest(rank, tuple(str(g) for g in gpus), cpus)


def assert_disjoint(plan: NodePlan) -> None:
    for a, b in combinations(plan.workers, 2):
        assert not set(a.cpus) & set(b.cpus), (a, b)


TWO_BY_FOUR = topo(["0-15", "16-31"], [0, 0, 0, 0, 1, 1, 1, 1], [[10, 21], [21, 10]])


def test_two_sockets_four_gpus_each() -> None:
    plan = plan_node(TWO_BY_FOUR, [req(r, r) for r in range(8)])
    assert_disjoint(plan)
    for w in plan.workers:
        home = 0 if w.local_rank < 4 else 1
        assert w.numa_node == home == w.gpu_numa_node
        assert set(w.cpus) <= set(TWO_BY_FOUR.node(home).cpus)
        assert len(w.cpus) == w.threads == 4 and not w.spilled and not w.notes
    assert sorted(c for w in plan.workers for c in w.cpus) == list(range(32))
    assert plan.rank_order == tuple(range(8))
    assert plan.for_rank(5).cpus == (20, 21, 22, 23)  # contiguous chunks in rank order


def test_interleaved_gpu_numbering_orders_ranks_by_numa_node() -> None:
    t = topo(["0-7", "8-15"], [0, 1, 0, 1, 0, 1, 0, 1])
    plan = plan_node(t, [req(r, r) for r in range(8)])
    assert plan.rank_order == (0, 2, 4, 6, 1, 3, 5, 7)
    assert_disjoint(plan)
    for w in plan.workers:
        assert w.numa_node == w.local_rank % 2 and len(w.cpus) == 2
        assert set(w.cpus) <= set(t.node(w.numa_node).cpus)


def test_ray_order_of_requests_does_not_matter() -> None:
    """Ray may hand ranks to GPUs in any order: the plan follows the GPU, not the rank."""
    plan = plan_node(TWO_BY_FOUR, [req(r, 7 - r) for r in range(8)])
    assert plan.rank_order == (7, 6, 5, 4, 3, 2, 1, 0)
    assert plan.for_rank(0).numa_node == 1 and plan.for_rank(7).numa_node == 0


def test_more_workers_than_cores_share_cpus_and_say_so() -> None:
    t = topo(["0-1", "2-3"], [0, 0, 0, 1, 1, 1])
    plan = plan_node(t, [req(r, r) for r in range(6)])
    for w in plan.workers:
        assert w.cpus and set(w.cpus) <= set(t.node(w.gpu_numa_node).cpus)
    shared = [w for w in plan.workers if w.shared]
    assert [w.local_rank for w in shared] == [2, 5]
    assert all("shared" in " ".join(w.notes) for w in shared)
    assert_disjoint(NodePlan(tuple(w for w in plan.workers if not w.shared), ()))


def test_spill_goes_to_the_nearest_node_only_when_it_must() -> None:
    t = topo(["0-1", "2-9", "10-17"], [0, 0, 0, 1],
             [[10, 30, 20], [30, 10, 20], [20, 20, 10]])
    plan = plan_node(t, [req(r, r) for r in range(4)])
    assert_disjoint(plan)
    spilled = [w for w in plan.workers if w.spilled]
    assert [w.local_rank for w in spilled] == [2]
    w2 = plan.for_rank(2)
    assert set(w2.cpus) <= set(t.node(2).cpus) and w2.numa_node == 2 and w2.gpu_numa_node == 0
    assert "spilled" in w2.notes[0] and "node 2" in w2.notes[0] and "distance 20" in w2.notes[0]
    assert {plan.for_rank(0).numa_node, plan.for_rank(1).numa_node} == {0}


def test_fractional_gpus_two_workers_share_one_gpu() -> None:
    t = topo(["0-7", "8-15"], [0, 1])
    plan = plan_node(t, [req(0, 0), req(1, 0), req(2, 1), req(3, 1)])
    assert_disjoint(plan)
    assert [w.numa_node for w in plan.workers] == [0, 0, 1, 1]
    assert all(len(w.cpus) == 4 for w in plan.workers)


def test_cpu_only_workers_go_where_cpus_are_free() -> None:
    t = topo(["0-3", "4-11"], [0, 0])
    plan = plan_node(t, [req(0, 0, cpus=2), req(1, 1, cpus=2), req(2), req(3)])
    assert_disjoint(plan)
    for cpu_only in (plan.for_rank(2), plan.for_rank(3)):
        assert cpu_only.gpu_numa_node is None and cpu_only.numa_node == 1
    assert plan.rank_order[:2] == (0, 1)


def test_num_cpus_is_the_minimum_and_leftovers_are_shared_out() -> None:
    t = topo(["0-9"], [0, 0])
    plan = plan_node(t, [req(0, 0, cpus=7), req(1, 1, cpus=1)])
    assert len(plan.for_rank(0).cpus) >= 7 and len(plan.for_rank(1).cpus) >= 1
    assert sum(w.threads for w in plan.workers) == 10
    frac = plan_node(t, [req(0, 0, cpus=0.5), req(1, 1, cpus=0)])
    assert all(len(w.cpus) == 5 for w in frac.workers)


def test_unknown_numa_on_a_multi_node_machine() -> None:
    t = topo(["0-3", "4-7"], [-1, 1])
    plan = plan_node(t, [req(0, 0), req(1, 1)])
    w0 = plan.for_rank(0)
    assert w0.gpu_numa_node is None and w0.cpus and "no NUMA node" in w0.notes[0]
    assert w0.numa_node == 0  # placed where CPUs are free
    assert plan.rank_order == (1, 0)


def test_single_node_machine_and_unknown_numa_there() -> None:
    t = topo(["0-7"], [-1, -1])
    plan = plan_node(t, [req(0, 0), req(1, 1)])
    assert [w.gpu_numa_node for w in plan.workers] == [0, 0]
    assert [w.cpus for w in plan.workers] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert "single NUMA node" in plan.notes[0]
    # Logical GPUs (Ray's num_gpus on a machine without them): not in the topology at all.
    logical = plan_node(topo(["0-7"], []), [req(0, 0), req(1, 1)])
    assert [w.gpu_numa_node for w in logical.workers] == [0, 0]


def test_uuid_ids_and_ids_missing_from_the_topology() -> None:
    t = topo(["0-3", "4-7"], [0, 1], uuids=True)
    plan = plan_node(t, [req(0, "GPU-0001"), req(1, "GPU-0000"), req(2, 9)])
    assert plan.for_rank(0).gpu_indices == (1,) and plan.for_rank(0).numa_node == 1
    assert plan.rank_order == (1, 0, 2)
    assert "not in this node's topology" in plan.for_rank(2).notes[0]


def test_worker_with_gpus_on_two_nodes_uses_the_majority_node() -> None:
    t = topo(["0-3", "4-7"], [0, 1, 1])
    w = plan_node(t, [req(0, 0, 1, 2)]).workers[0]
    assert w.gpu_numa_node == 1 and w.numa_node == 1 and "span" in w.notes[0]


def test_bad_requests_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="repeat"):
        plan_node(TWO_BY_FOUR, [req(0, 0), req(0, 1)])
    with pytest.raises(ConfigError, match="num_cpus"):
        plan_node(TWO_BY_FOUR, [req(0, 0, cpus=-1)])


def test_topology_without_cpus_plans_nothing() -> None:
    t = topology_from_dict({"numa_nodes": [{"id": 0, "cpus": ""}]})
    plan = plan_node(t, [req(0)])
    assert plan.workers[0].cpus == () and "no CPUs" in plan.notes[0]


def test_requests_from_the_dicts_workers_exchange() -> None:
    r = WorkerRequest.from_dict({"local_rank": 3, "gpu_ids": ["2", "3"], "num_cpus": 4})
    assert r == WorkerRequest(3, ("2", "3"), 4.0)
    assert WorkerRequest.from_dict({"local_rank": 0, "gpu_ids": [], "num_cpus": None}).num_cpus == 0


def test_plan_cluster_plans_each_node() -> None:
    plans = plan_cluster({f"n{i}": (TWO_BY_FOUR, [req(r, r) for r in range(8)]) for i in range(3)})
    assert sorted(plans) == ["n0", "n1", "n2"]
    assert all(p.rank_order == tuple(range(8)) for p in plans.values())


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Topology, list[WorkerRequest]]:
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=4))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    cpus = [f"{s}-{s + n - 1}" for s, n in zip(starts, sizes, strict=True)]
    gpu_nodes = draw(st.lists(st.integers(-1, len(sizes) - 1), max_size=8))
    t = topo(cpus, gpu_nodes)
    n = draw(st.integers(1, 10))
    reqs = [req(r, *draw(st.lists(st.integers(0, max(0, len(gpu_nodes) - 1)), max_size=2,
                                  unique=True)) if gpu_nodes else (),
                cpus=draw(st.sampled_from([0, 0.5, 1, 2, 3])))
            for r in range(n)]
    return t, reqs


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_planner_invariants(case: tuple[Topology, list[WorkerRequest]]) -> None:
    t, reqs = case
    plan = plan_node(t, reqs)
    assert sorted(plan.rank_order) == sorted(r.local_rank for r in reqs)
    total = len(t.all_cpus())
    needs = {r.local_rank: max(1, math.ceil(r.num_cpus)) for r in reqs}
    for w in plan.workers:
        assert w.cpus and set(w.cpus) <= set(t.all_cpus()) and w.threads == len(w.cpus)
    if sum(needs.values()) <= total:
        assert_disjoint(plan)
        assert all(len(w.cpus) >= needs[w.local_rank] for w in plan.workers)
    for node in t.numa_nodes:  # spill only when the GPU's node cannot serve its workers
        homed = [w for w in plan.workers if w.gpu_numa_node == node.id]
        if sum(needs[w.local_rank] for w in homed) <= len(node.cpus):
            assert not any(w.spilled or w.shared for w in homed)
            assert all(set(w.cpus) <= set(node.cpus) for w in homed)


def test_rank_permutation_within_nodes() -> None:
    from rayguard.placement.numa import numa_rank_permutation

    interleaved = topo(["0-7", "8-15"], [0, 1, 0, 1])
    # Ray's order: node a (GPUs 0..3 by id), then node b; node c has no topology.
    nodes = ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    reqs = [req(0, g) for g in (0, 1, 2, 3)] + [req(0, 1), req(0, 0)] + [req(0), req(0)]
    perm = numa_rank_permutation(nodes, reqs, {"a": interleaved, "b": interleaved})
    assert perm == [0, 2, 1, 3, 5, 4, 6, 7]
    assert numa_rank_permutation(nodes[:4], reqs[:4], {}) == [0, 1, 2, 3]
