"""rayguard.placement: where a worker's work runs.

* :mod:`~rayguard.placement.topology`: a node's GPUs and NUMA nodes (NVML, sysfs, or the
  ``RAYGUARD_TOPOLOGY`` JSON override).
* :mod:`~rayguard.placement.numa`: the pure NUMA planner (CPU sets, threads, rank order).
* :mod:`~rayguard.placement.binding`: applies a plan inside a worker (:func:`setup_numa`).
"""

from __future__ import annotations

from rayguard.placement.binding import BindingResult, bind_worker, setup_numa
from rayguard.placement.numa import (
    NodePlan,
    WorkerPlan,
    WorkerRequest,
    plan_cluster,
    plan_node,
)
from rayguard.placement.topology import (
    GpuInfo,
    NumaNode,
    Topology,
    TopologyError,
    discover_topology,
    load_topology_file,
    topology_from_dict,
)

__all__ = [
    "BindingResult",
    "GpuInfo",
    "NodePlan",
    "NumaNode",
    "Topology",
    "TopologyError",
    "WorkerPlan",
    "WorkerRequest",
    "bind_worker",
    "discover_topology",
    "load_topology_file",
    "plan_cluster",
    "plan_node",
    "setup_numa",
    "topology_from_dict",
]
