"""A node's GPU/NUMA topology, the way the NUMA planner gets it.

Discovery order (first that answers wins):

1. ``RAYGUARD_TOPOLOGY`` names a JSON file (:mod:`rayguard.placement.schema`): used as is,
   so any layout can be simulated on a machine without GPUs or sockets.
2. This machine (:func:`rayguard.placement.discovery.discover_machine`): GPUs from NVML
   when ``pynvml`` is importable and initialisable, else from sysfs
   (``/proc/driver/nvidia/gpus`` or the PCI tree), else none; NUMA nodes from
   ``/sys/devices/system/node``.

The pieces live in their own modules: the records in :mod:`~rayguard.placement.model`, the
cpulist format in :mod:`~rayguard.placement.cpulist`, the JSON form in
:mod:`~rayguard.placement.schema`, the machine reading in
:mod:`~rayguard.placement.discovery`. The records and the JSON form's names are re-exported
here (``__all__``); the rest is imported from its own module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.placement.discovery import discover_machine
from rayguard.placement.model import (
    LOCAL_DISTANCE,
    REMOTE_DISTANCE,
    UNKNOWN_NUMA,
    GpuInfo,
    NumaNode,
    Topology,
)
from rayguard.placement.schema import TopologyError, load_topology_file, topology_from_dict


def discover_topology(environ: Mapping[str, str] | None = None) -> Topology:
    """This node's topology: the override file if ``RAYGUARD_TOPOLOGY`` is set, else NVML,
    else sysfs. Raises :class:`TopologyError` only for a bad override file."""
    env = os.environ if environ is None else environ
    override = env.get(TOPOLOGY_ENV_VAR, "")
    if override:
        return load_topology_file(override)
    return discover_machine()


__all__ = [
    "LOCAL_DISTANCE",
    "REMOTE_DISTANCE",
    "UNKNOWN_NUMA",
    "GpuInfo",
    "NumaNode",
    "Topology",
    "TopologyError",
    "discover_topology",
    "load_topology_file",
    "topology_from_dict",
]
