"""rayguard.placement: where a worker's work runs.

* :mod:`~rayguard.placement.topology`: a node's GPUs and NUMA nodes (the
  ``RAYGUARD_TOPOLOGY`` JSON override, else :mod:`~rayguard.placement.discovery`: NVML,
  sysfs), described by :mod:`~rayguard.placement.model`, its JSON form in
  :mod:`~rayguard.placement.schema`.
* :mod:`~rayguard.placement.numa`: the pure NUMA planner (CPU sets, threads, rank order).
* :mod:`~rayguard.placement.binding`: applies a plan inside a worker (:func:`setup_numa`).
"""

from __future__ import annotations

from rayguard.placement.binding import BindingResult, bind_worker, setup_numa
from rayguard.placement.model import GpuInfo, NumaNode, Topology
from rayguard.placement.numa import (
    NodePlan,
    WorkerPlan,
    WorkerRequest,
    plan_cluster,
    plan_node,
)
from rayguard.placement.schema import TopologyError, load_topology_file, topology_from_dict
from rayguard.placement.topology import discover_topology

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
