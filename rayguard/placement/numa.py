"""The NUMA planner: which CPUs each worker on a node gets. Pure: topology + requests in,
a :class:`NodePlan` out; nothing is read from or done to the machine here.

Rules, in order:

1. A worker's *home* is the NUMA node of its GPU(s) (the node holding most of them when they
   span nodes). A CPU-only worker, or one whose GPU's node is unknown, has no home; on a
   single-node machine every worker's home is that node.
2. Each worker first gets ``ceil(num_cpus)`` (at least 1) CPUs from its home, in rank order.
3. Workers without a home go to the node with the most free CPUs.
4. A worker its home cannot serve takes CPUs from the nearest node (by NUMA distance) that
   has some free, and its notes say so. Only when the whole machine is full do workers share
   CPUs (oversubscription), and the notes say that too.
5. CPUs left on a node are shared out evenly among the workers living there, so together
   the workers use the whole node (their data loaders inherit the set).
6. On each node, CPUs are cut into contiguous chunks in rank order, following the node's
   CPU order (SMT siblings adjacent), so a worker gets whole cores where possible.

The rank order of a node is by home NUMA node, then lowest GPU index, then local rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayguard.exceptions import ConfigError
from rayguard.placement.model import UNKNOWN_NUMA, GpuInfo, Topology


@dataclass(frozen=True)
class WorkerRequest:
    """One worker on a node, as Ray placed it."""

    local_rank: int
    gpu_ids: tuple[str, ...] = ()
    """``ray.get_gpu_ids()`` of the actor: physical indices as strings, or UUIDs."""
    num_cpus: float = 1.0
    """CPUs Ray reserved for the actor (the minimum the worker is bound to)."""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WorkerRequest:
        """From the ``{"local_rank", "gpu_ids", "num_cpus"}`` dict the workers exchange."""
        gpu_ids = raw.get("gpu_ids") or ()
        if isinstance(gpu_ids, (str, int)):
            gpu_ids = (gpu_ids,)
        return cls(int(raw["local_rank"]), tuple(str(g) for g in gpu_ids),
                   float(raw.get("num_cpus", 1.0) or 0.0))


@dataclass(frozen=True)
class WorkerPlan:
    """Where one worker should run."""

    local_rank: int
    numa_node: int | None
    """NUMA node holding most of the worker's CPUs (its GPU's node when it could be served);
    None when the topology has no CPUs at all."""
    cpus: tuple[int, ...]
    """CPU ids to bind to, sorted."""
    threads: int
    """Intra-op thread count (= ``len(cpus)``, at least 1)."""
    gpu_numa_node: int | None = None
    """NUMA node of the worker's GPU; None for a CPU-only worker or an unknown node (on a
    single-node machine an unknown GPU node is taken to be that node)."""
    gpu_ids: tuple[str, ...] = ()
    """The GPU ids the worker asked with, as given."""
    gpu_indices: tuple[int, ...] = ()
    """The worker's GPUs as topology indices (UUIDs resolved), in the order given."""
    spilled: bool = False
    """Some CPUs come from a node other than the GPU's (the home node was full)."""
    shared: bool = False
    """Some CPUs are shared with another worker (more workers than CPUs)."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodePlan:
    """The plan of every worker on one node."""

    workers: tuple[WorkerPlan, ...]
    """Sorted by local rank."""
    rank_order: tuple[int, ...]
    """Local ranks ordered by NUMA node, then GPU: the order ranks should take on the node."""
    notes: tuple[str, ...] = ()
    hostname: str = ""

    def for_rank(self, local_rank: int) -> WorkerPlan:
        for w in self.workers:
            if w.local_rank == local_rank:
                return w
        raise KeyError(f"no worker with local_rank={local_rank} in the plan")


@dataclass
class _Work:
    """Mutable planning state for one worker."""

    req: WorkerRequest
    need: int
    gpu_indices: tuple[int, ...] = ()
    gpu_node: int | None = None
    home: int | None = None
    counts: dict[int, int] = field(default_factory=dict)  # node -> CPUs taken there
    shared_need: int = 0
    notes: list[str] = field(default_factory=list)


def _resolve_gpus(by_id: Mapping[str, GpuInfo], w: _Work) -> None:
    nodes: list[int] = []
    indices: list[int] = []
    for gid in w.req.gpu_ids:
        gpu = by_id.get(gid.strip())
        if gpu is None:
            w.notes.append(f"GPU {gid!r} is not in this node's topology; its NUMA node is unknown")
            continue
        indices.append(gpu.index)
        if gpu.numa_node != UNKNOWN_NUMA:
            nodes.append(gpu.numa_node)
        else:
            w.notes.append(f"GPU {gpu.index} reports no NUMA node (-1)")
    w.gpu_indices = tuple(indices)
    if nodes:
        w.gpu_node = max(sorted(set(nodes)), key=nodes.count)
        if len(set(nodes)) > 1:
            w.notes.append(f"GPUs span NUMA nodes {sorted(set(nodes))}; using node {w.gpu_node}")


def _check_requests(workers: Sequence[WorkerRequest]) -> None:
    ranks = [w.local_rank for w in workers]
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"plan_node(workers): local ranks {sorted(ranks)} repeat. "
                          "Fix: pass one request per worker on the node")
    for w in workers:
        if w.num_cpus < 0 or math.isnan(w.num_cpus):
            raise ConfigError(f"plan_node(workers[local_rank={w.local_rank}].num_cpus="
                              f"{w.num_cpus!r}): must be >= 0. Fix: pass the actor's CPUs")


def rank_key(w: WorkerPlan | _Work) -> tuple[int, int, int]:
    """Sort key of the node rank order: NUMA node, lowest GPU index, local rank."""
    if isinstance(w, WorkerPlan):
        node, gpus, rank = w.gpu_numa_node, w.gpu_indices, w.local_rank
    else:
        node, gpus, rank = w.home, w.gpu_indices, w.req.local_rank
    big = 1 << 30
    return (big if node is None else node, min(gpus) if gpus else big, rank)


def _take(free: dict[int, int], node: int, w: _Work, want: int) -> int:
    got = min(want, free[node])
    if got:
        free[node] -= got
        w.counts[node] = w.counts.get(node, 0) + got
    return got


def _allocate(topology: Topology, works: list[_Work]) -> None:
    """Rules 2-5: CPU counts per worker per node."""
    free = {n.id: len(n.cpus) for n in topology.numa_nodes}
    short: list[tuple[_Work, int]] = []
    for w in works:  # rule 2
        if w.home is not None:
            missing = w.need - _take(free, w.home, w, w.need)
            if missing:
                short.append((w, missing))
    for w in works:  # rule 3
        if w.home is None:
            w.home = max(free, key=lambda n: (free[n], -n))
            missing = w.need - _take(free, w.home, w, w.need)
            if missing:
                short.append((w, missing))
    for w, missing in short:  # rule 4
        home = w.home if w.home is not None else topology.numa_nodes[0].id
        for node in sorted(free, key=lambda n: (topology.distance(home, n), n)):
            if node != home and missing:
                got = _take(free, node, w, missing)
                if got:
                    missing -= got
                    w.notes.append(f"node {home} is full: {got} CPU(s) spilled to node {node} "
                                   f"(distance {topology.distance(home, node)})")
        if missing:
            w.shared_need = missing
            w.notes.append(f"the machine has fewer free CPUs than workers need: {missing} CPU(s) "
                           f"shared with other workers on node {home}")
    for node, left in free.items():  # rule 5
        residents = [w for w in works if w.home == node]
        for i, w in enumerate(residents):
            extra = left // len(residents) + (1 if i < left % len(residents) else 0)
            if extra:
                w.counts[node] = w.counts.get(node, 0) + extra


def _cut(topology: Topology, works: list[_Work]) -> dict[int, list[int]]:
    """Rule 6: concrete CPU ids, chunked per node in rank order (residents first)."""
    out: dict[int, list[int]] = {w.req.local_rank: [] for w in works}
    for n in topology.numa_nodes:
        users = sorted((w for w in works if n.id in w.counts),
                       key=lambda w: (w.home != n.id, rank_key(w)))
        pos = 0
        for w in users:
            out[w.req.local_rank].extend(n.cpus[pos:pos + w.counts[n.id]])
            pos += w.counts[n.id]
    cursor: dict[int, int] = {}
    for w in works:  # oversubscribed: reuse the home node's CPUs, cycling from its end
        if w.shared_need and w.home is not None:
            pool = list(reversed(topology.node(w.home).cpus)) or topology.all_cpus()
            start = cursor.get(w.home, 0)
            mine = out[w.req.local_rank]
            for i in range(min(w.shared_need, len(pool))):
                cpu = pool[(start + i) % len(pool)]
                if cpu not in mine:
                    mine.append(cpu)
            cursor[w.home] = start + w.shared_need
    return out


def plan_node(topology: Topology, workers: Sequence[WorkerRequest]) -> NodePlan:
    """Plan CPU sets, thread counts and the rank order for the workers of one node."""
    _check_requests(workers)
    if not any(n.cpus for n in topology.numa_nodes):
        return NodePlan(tuple(WorkerPlan(w.local_rank, None, (), 1) for w in workers),
                        tuple(sorted(w.local_rank for w in workers)),
                        ("topology lists no CPUs: nothing to bind",), topology.hostname)
    nodes_with_cpus = [n.id for n in topology.numa_nodes if n.cpus]
    works = [_Work(r, max(1, math.ceil(r.num_cpus))) for r in workers]
    by_id = {str(g.index): g for g in topology.gpus}
    by_id.update({g.uuid: g for g in topology.gpus if g.uuid})
    for w in works:
        _resolve_gpus(by_id, w)
        w.home = w.gpu_node if w.gpu_node in nodes_with_cpus else None
        if w.home is None and len(nodes_with_cpus) == 1:
            w.home = nodes_with_cpus[0]
            if w.req.gpu_ids and w.gpu_node is None:
                w.gpu_node = w.home  # the only node there is (logical GPUs land here too)
    works.sort(key=rank_key)  # GPU-homed first, by node then GPU; the rest after
    _allocate(topology, works)
    cpus = _cut(topology, works)
    plans = []
    for w in works:
        main = max(w.counts, key=lambda n: (w.counts[n], n == w.home)) if w.counts else w.home
        mine = sorted(set(cpus[w.req.local_rank]))
        plans.append(WorkerPlan(
            local_rank=w.req.local_rank, numa_node=main, cpus=tuple(mine),
            threads=max(1, len(mine)),
            gpu_numa_node=w.gpu_node, gpu_indices=w.gpu_indices, gpu_ids=w.req.gpu_ids,
            spilled=any(n != w.gpu_node for n in w.counts) and w.gpu_node is not None,
            shared=w.shared_need > 0, notes=tuple(w.notes)))
    order = tuple(p.local_rank for p in sorted(plans, key=rank_key))
    notes = []
    if len(topology.numa_nodes) == 1:
        notes.append("single NUMA node: binding only keeps workers off each other's CPUs")
    return NodePlan(tuple(sorted(plans, key=lambda p: p.local_rank)), order, tuple(notes),
                    topology.hostname)


def plan_cluster(
    nodes: Mapping[str, tuple[Topology, Sequence[WorkerRequest]]],
) -> dict[str, NodePlan]:
    """Plan every node of a cluster: ``{node_id: (topology, requests)}`` -> plans."""
    return {node_id: plan_node(topo, reqs) for node_id, (topo, reqs) in nodes.items()}


def numa_rank_permutation(node_ids: Sequence[str], requests: Sequence[WorkerRequest],
                          topologies: Mapping[str, Topology]) -> list[int]:
    """Reorder world ranks so that, on each node, they follow the NUMA plan's rank order.

    ``node_ids[i]`` and ``requests[i]`` describe the worker that now holds world rank ``i``
    (``requests[i].local_rank`` is ignored). Returns ``perm`` with ``perm[new] = old``: node
    blocks keep their place (in order of first appearance), only ranks within a node move.
    A node missing from ``topologies`` keeps its order.
    """
    blocks: dict[str, list[int]] = {}
    for i, node in enumerate(node_ids):
        blocks.setdefault(node, []).append(i)
    perm: list[int] = []
    for node, members in blocks.items():
        topo = topologies.get(node)
        if topo is None:
            perm.extend(members)
            continue
        local = [WorkerRequest(j, requests[i].gpu_ids, requests[i].num_cpus)
                 for j, i in enumerate(members)]
        perm.extend(members[j] for j in plan_node(topo, local).rank_order)
    return perm
