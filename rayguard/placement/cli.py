"""``rayguard topology``: this node's (or every Ray node's) GPU/NUMA topology and the NUMA
plan rayguard would apply to N workers on it."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rayguard.connect import (
    DEFAULT_CONNECT_TIMEOUT_S,
    ClusterUnavailableError,
    Notify,
    call_connected,
    init_ray,
)
from rayguard.exceptions import ConfigError
from rayguard.inert import inert, inert_lines
from rayguard.placement.cpulist import format_cpulist
from rayguard.placement.model import Topology
from rayguard.placement.numa import NodePlan, WorkerRequest, plan_node
from rayguard.placement.schema import topology_from_dict
from rayguard.placement.topology import discover_topology


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "topology", help="show GPU/NUMA topology and the NUMA binding plan",
        description="Show this node's GPUs, NUMA nodes and the CPU sets rayguard would bind N "
                    "workers to. RAYGUARD_TOPOLOGY=<file.json> simulates a topology.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--workers", type=int, default=None,
                   help="workers to plan on each node (default: one per GPU)")
    p.add_argument("--gpus-per-worker", type=float, default=1.0,
                   help="GPUs per worker: 0 for CPU workers, 0.5 to share a GPU (default 1)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="CPUs Ray reserves per worker (default 1)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address: show every alive node of that cluster")
    p.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                   help=f"seconds to wait for the cluster connect (default "
                        f"{DEFAULT_CONNECT_TIMEOUT_S:.0f})")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for every node's answer (default 60)")
    p.set_defaults(func=run)


def example_requests(topology: Topology, workers: int | None, gpus_per_worker: float,
                     cpus_per_worker: float) -> list[WorkerRequest]:
    """Requests as Ray would place ``workers`` workers on this node, GPUs in index order."""
    indices = [g.index for g in topology.gpus]
    if gpus_per_worker < 0 or cpus_per_worker < 0:
        raise ConfigError("rayguard topology: --gpus-per-worker and --cpus-per-worker must be "
                          ">= 0. Fix: pass e.g. --gpus-per-worker 1")
    if workers is None:
        workers = int(len(indices) / gpus_per_worker) if gpus_per_worker else 0
    if workers < 0:
        raise ConfigError(f"rayguard topology --workers={workers}: must be >= 0. Fix: pass 2")
    reqs = []
    for i in range(workers):
        if gpus_per_worker == 0:
            ids: tuple[str, ...] = ()
        elif gpus_per_worker >= 1:
            g = int(gpus_per_worker)
            ids = tuple(str(x) for x in indices[i * g:(i + 1) * g])
        else:
            k = math.floor(i * gpus_per_worker)
            ids = (str(indices[k]),) if k < len(indices) else ()
        if gpus_per_worker and len(ids) < max(1, int(gpus_per_worker)):
            raise ConfigError(f"rayguard topology: {workers} workers x {gpus_per_worker} GPUs "
                              f"need more than the {len(indices)} GPUs of this node. Fix: pass "
                              "fewer --workers")
        reqs.append(WorkerRequest(i, ids, cpus_per_worker))
    return reqs


def _node_text(topo: Topology, plan: NodePlan) -> list[str]:
    lines = [f"node {topo.hostname} (topology from {topo.source})"]
    for n in topo.numa_nodes:
        mem = f", {n.memory_mb} MB" if n.memory_mb is not None else ""
        dist = " ".join(str(topo.distance(n.id, o)) for o in topo.node_ids())
        lines.append(f"  NUMA node {n.id}: cpus {format_cpulist(n.cpus) or '-'} "
                     f"({len(n.cpus)}){mem}, distances {dist}")
    for g in topo.gpus:
        numa = "unknown" if g.numa_node < 0 else g.numa_node
        lines.append(f"  GPU {g.index}: NUMA node {numa}, bus {g.pci_bus_id or '?'}"
                     + (f", {g.uuid}" if g.uuid else ""))
    if not topo.gpus:
        lines.append("  GPUs: none found")
    lines.append(f"  plan for {len(plan.workers)} worker(s), rank order {list(plan.rank_order)}:")
    for w in plan.workers:
        gpus = ",".join(map(str, w.gpu_indices)) or "-"
        lines.append(f"    local_rank {w.local_rank}: GPU {gpus} -> NUMA node {w.numa_node}, "
                     f"cpus {format_cpulist(w.cpus)}, {w.threads} thread(s)")
        lines.extend(f"      note: {note}" for note in w.notes)
    lines.extend(f"  note: {note}" for note in plan.notes)
    return lines


def topologies_in_child(notify: Notify, *, address: str, timeout_s: float) -> list[dict[str, Any]]:
    """The helper process's side (:func:`rayguard.connect.call_connected`): every alive
    node's topology as a dict."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    notify("connecting", address=address)
    init_ray(address, found_automatically=address == "auto", notify=notify,
             command="rayguard topology")
    notify("connected")
    try:
        @ray.remote(num_cpus=0)
        def _probe() -> dict[str, Any]:
            return discover_topology().to_dict()

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = [_probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote() for n in nodes]
        return list(ray.get(refs, timeout=timeout_s))
    finally:
        ray.shutdown()


def _cluster_topologies(args: argparse.Namespace) -> list[Topology]:
    data = call_connected("rayguard.placement.cli:topologies_in_child",
                          {"address": args.address, "timeout_s": args.timeout},
                          command="rayguard topology", address=args.address,
                          local_hint="omit --address to show only this machine",
                          connect_timeout_s=args.connect_timeout, timeout_s=args.timeout + 30,
                          progress=None if args.json else sys.stderr)
    return [topology_from_dict(d, source=d.get("source", "remote")) for d in data]


def run(args: argparse.Namespace) -> int:
    try:
        topologies = _cluster_topologies(args) if args.address else [discover_topology()]
        plans = [plan_node(t, example_requests(t, args.workers, args.gpus_per_worker,
                                               args.cpus_per_worker)) for t in topologies]
    except ConfigError as exc:
        print(json.dumps({"error": str(exc), "reason": "config"}) if args.json else f"error: {exc}")
        return 2
    except ClusterUnavailableError as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "reason": exc.kind}))
        else:
            print(inert_lines(str(exc)), file=sys.stderr)
        return 2
    if args.json:
        out = [{"topology": t.to_dict(),
                "plan": {"rank_order": list(p.rank_order), "notes": list(p.notes),
                         "workers": [{"local_rank": w.local_rank, "numa_node": w.numa_node,
                                      "cpus": list(w.cpus), "threads": w.threads,
                                      "gpus": list(w.gpu_indices), "notes": list(w.notes)}
                                     for w in p.workers]}}
               for t, p in zip(topologies, plans, strict=True)]
        print(json.dumps(out if args.address else out[0], indent=2))
    else:
        for t, p in zip(topologies, plans, strict=True):
            print("\n".join(inert(line) for line in _node_text(t, p)))  # other nodes' text
    return 0
