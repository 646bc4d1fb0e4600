"""The JSON form of a topology (what ``RAYGUARD_TOPOLOGY`` names and ``rayguard topology
--json`` prints), read with every field checked.

Schema (``"version"`` optional, must be 1 when given)::

    {
      "version": 1,
      "hostname": "sim-2socket",                      # optional
      "numa_nodes": [                                 # required, >= 1 entry, unique ids
        {"id": 0, "cpus": "0-15,32-47",               # cpulist string or list of ints
         "memory_mb": 257000,                         # optional
         "distances": [10, 21]},                      # optional, one per numa_nodes entry
        {"id": 1, "cpus": [16, 17], "distances": [21, 10]}
      ],
      "gpus": [                                       # optional, default []
        {"index": 0, "numa_node": 0,                  # numa_node -1 = unknown
         "pci_bus_id": "0000:18:00.0", "uuid": "GPU-..."}   # both optional
      ]
    }

A bad file raises :class:`TopologyError` naming the field (``numa_nodes[1].cpus``). The
writing side is :meth:`rayguard.placement.model.Topology.to_dict`.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.exceptions import ConfigError
from rayguard.placement.cpulist import parse_cpulist
from rayguard.placement.model import UNKNOWN_NUMA, GpuInfo, NumaNode, Topology, normalize_bus_id


class TopologyError(ConfigError):
    """A topology file (``RAYGUARD_TOPOLOGY``) is missing or does not match the schema."""


def _fail(field_name: str, value: object, why: str, fix: str) -> TopologyError:
    return TopologyError(f"topology({field_name}={value!r}): {why}. Fix: {fix}")


def _int_field(obj: Mapping[str, Any], key: str, where: str, minimum: int) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _fail(f"{where}.{key}", value, f"must be an int >= {minimum}",
                    f'write e.g. "{key}": {max(minimum, 0)}')
    return value


def _parse_node(raw: object, where: str, count: int) -> tuple[NumaNode, list[int] | None]:
    """One ``numa_nodes`` entry, and its distance row (resolved once all ids are known)."""
    if not isinstance(raw, Mapping):
        raise _fail(where, raw, "must be an object", 'write {"id": 0, "cpus": "0-3"}')
    node_id = _int_field(raw, "id", where, 0)
    cpus_raw = raw.get("cpus")
    try:
        if isinstance(cpus_raw, str):
            cpus = parse_cpulist(cpus_raw)
        elif isinstance(cpus_raw, list) and all(
            isinstance(c, int) and not isinstance(c, bool) for c in cpus_raw
        ):
            cpus = list(cpus_raw)
        else:
            raise ValueError("not a cpulist string or a list of ints")
        if any(c < 0 for c in cpus) or len(set(cpus)) != len(cpus):
            raise ValueError("negative or repeated CPU ids")
    except ValueError as exc:
        raise _fail(f"{where}.cpus", cpus_raw, f"is not a valid CPU list ({exc})",
                    'write a cpulist such as "0-15,32-47" or a list such as [0, 1]') from None
    memory = raw.get("memory_mb")
    if memory is not None:
        memory = _int_field(raw, "memory_mb", where, 0)
    dist_raw = raw.get("distances")
    if dist_raw is not None and not (
        isinstance(dist_raw, list) and len(dist_raw) == count
        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dist_raw)
    ):
        raise _fail(f"{where}.distances", dist_raw,
                    f"must be a list of {count} positive ints, one per numa_nodes entry",
                    "copy the row of `numactl --hardware` or leave it out")
    return NumaNode(node_id, tuple(cpus), memory), dist_raw


def _parse_gpu(raw: object, where: str, node_ids: set[int]) -> GpuInfo:
    if not isinstance(raw, Mapping):
        raise _fail(where, raw, "must be an object", 'write {"index": 0, "numa_node": 0}')
    index = _int_field(raw, "index", where, 0)
    numa = raw.get("numa_node", UNKNOWN_NUMA)
    if numa is None:
        numa = UNKNOWN_NUMA
    if not isinstance(numa, int) or isinstance(numa, bool) or (
        numa != UNKNOWN_NUMA and numa not in node_ids
    ):
        raise _fail(f"{where}.numa_node", numa,
                    f"must be one of the numa_nodes ids {sorted(node_ids)} or -1 (unknown)",
                    "give the id of a listed NUMA node")
    bus, uuid = raw.get("pci_bus_id"), raw.get("uuid")
    for key, value in (("pci_bus_id", bus), ("uuid", uuid)):
        if value is not None and not isinstance(value, str):
            raise _fail(f"{where}.{key}", value, "must be a string or null", f"quote the {key}")
    return GpuInfo(index, numa, normalize_bus_id(bus) if bus else None, uuid)


def topology_from_dict(data: object, source: str = "manual") -> Topology:
    """Build a :class:`Topology` from its JSON form, checking every field."""
    if not isinstance(data, Mapping):
        raise _fail("<root>", type(data).__name__, "must be a JSON object",
                    'start from {"numa_nodes": [...], "gpus": [...]}')
    if data.get("version", 1) != 1:
        raise _fail("version", data.get("version"), "only version 1 is known", "write 1")
    raw_nodes = data.get("numa_nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise _fail("numa_nodes", raw_nodes, "must be a non-empty list",
                    'list each node, e.g. [{"id": 0, "cpus": "0-7"}]')
    parsed = [_parse_node(n, f"numa_nodes[{i}]", len(raw_nodes)) for i, n in enumerate(raw_nodes)]
    ids = [n.id for n, _ in parsed]
    if len(set(ids)) != len(ids):
        raise _fail("numa_nodes", ids, "ids must be unique", "number the nodes 0, 1, ...")
    seen: dict[int, int] = {}
    nodes = []
    for i, (n, row) in enumerate(parsed):
        for c in n.cpus:
            if c in seen:
                raise _fail(f"numa_nodes[{i}].cpus", c, f"CPU {c} is also in node {seen[c]}",
                            "give each CPU to one node")
            seen[c] = n.id
        dist = dict(zip(ids, row, strict=True)) if row else {}
        nodes.append(NumaNode(n.id, n.cpus, n.memory_mb, dist))
    raw_gpus = data.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise _fail("gpus", raw_gpus, "must be a list", "write [] for a node without GPUs")
    gpus = [_parse_gpu(g, f"gpus[{i}]", set(ids)) for i, g in enumerate(raw_gpus)]
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise _fail("gpus", indices, "GPU indices must be unique", "number the GPUs 0, 1, ...")
    hostname = data.get("hostname") or socket.gethostname()
    return Topology(tuple(nodes), tuple(sorted(gpus, key=lambda g: g.index)), source,
                    str(hostname))


def load_topology_file(path: str | os.PathLike[str]) -> Topology:
    """Read and validate a topology JSON file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise _fail(TOPOLOGY_ENV_VAR, str(path), f"cannot be read ({exc.strerror})",
                    "point it at an existing JSON file, or unset it to discover") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(TOPOLOGY_ENV_VAR, str(path), f"is not valid JSON ({exc})",
                    "fix the JSON syntax at the position given") from None
    return topology_from_dict(data, source=f"override:{path}")


__all__ = ["TopologyError", "load_topology_file", "topology_from_dict"]
