"""What a node's GPU/NUMA topology is: plain frozen records, no I/O.

Standard library only (plus :mod:`rayguard.placement.cpulist`): discovery builds these on
nodes where rayguard may not be importable (the doctor ships it by value), and the NUMA
planner reads them on the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rayguard.placement.cpulist import format_cpulist

UNKNOWN_NUMA = -1
LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20  # assumed when a topology gives no distances


def normalize_bus_id(bus_id: str) -> str:
    """NVML's / nvidia-smi's ``00000000:18:00.0`` and sysfs' ``0000:18:00.0`` ->
    ``0000:18:00.0`` (lower case, four-digit domain)."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}" if rest else bus_id


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver enumerates it (NVML index = PCI bus order)."""

    index: int
    """Physical index, the number Ray reports in ``ray.get_gpu_ids()`` by default."""
    numa_node: int = UNKNOWN_NUMA
    """NUMA node the GPU's PCI slot hangs off; ``-1`` when the platform does not say."""
    pci_bus_id: str | None = None
    """``dddd:bb:dd.f`` in lower case, or None when unknown."""
    uuid: str | None = None
    """``GPU-...`` as NVML reports it (matches UUID-form ``CUDA_VISIBLE_DEVICES``)."""
    name: str | None = None
    """The model (``NVIDIA H100 80GB HBM3``) where the source says; informational only."""


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs (in allocation order), memory and distances."""

    id: int
    cpus: tuple[int, ...]
    """Logical CPU ids, ordered so that SMT siblings sit next to each other where known."""
    memory_mb: int | None = None
    distances: Mapping[int, int] = field(default_factory=dict)
    """Distance to each node id (ACPI SLIT, local = 10). Missing: 10 to self, 20 to others."""


@dataclass(frozen=True)
class Topology:
    """A node's NUMA nodes and GPUs, and where this description came from."""

    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[GpuInfo, ...] = ()
    source: str = "manual"
    """``override:<path>``, ``nvml``, ``sysfs``, ``none`` (no GPUs found) or ``manual``."""
    hostname: str = ""

    def node(self, node_id: int) -> NumaNode:
        for n in self.numa_nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def node_ids(self) -> list[int]:
        return [n.id for n in self.numa_nodes]

    def distance(self, a: int, b: int) -> int:
        """NUMA distance from node ``a`` to node ``b`` (10 = local)."""
        if a == b:
            return LOCAL_DISTANCE
        return self.node(a).distances.get(b, REMOTE_DISTANCE)

    def all_cpus(self) -> list[int]:
        return sorted(c for n in self.numa_nodes for c in n.cpus)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :func:`rayguard.placement.schema.topology_from_dict` reads back."""
        ids = self.node_ids()
        return {
            "version": 1,
            "hostname": self.hostname,
            "source": self.source,
            "numa_nodes": [
                {"id": n.id, "cpus": format_cpulist(n.cpus), "memory_mb": n.memory_mb,
                 "distances": [self.distance(n.id, other) for other in ids]}
                for n in self.numa_nodes
            ],
            "gpus": [
                {"index": g.index, "numa_node": g.numa_node, "pci_bus_id": g.pci_bus_id,
                 "uuid": g.uuid}
                for g in self.gpus
            ],
        }


__all__ = ["LOCAL_DISTANCE", "REMOTE_DISTANCE", "UNKNOWN_NUMA", "GpuInfo", "NumaNode",
           "Topology", "normalize_bus_id"]
