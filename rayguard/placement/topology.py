"""A node's GPU/NUMA topology: what it is, where it comes from, and its JSON form.

Discovery order (first that answers wins):

1. ``RAYGUARD_TOPOLOGY`` names a JSON file (schema below): used as is, so any layout can be
   simulated on a machine without GPUs or sockets.
2. GPUs from NVML (``pynvml`` / ``nvidia-ml-py``) when importable and initialisable.
3. GPUs from sysfs: ``/proc/driver/nvidia/gpus/<bus>`` or, failing that, NVIDIA display/3D
   controllers under ``/sys/bus/pci/devices``; their NUMA node from
   ``/sys/bus/pci/devices/<bus>/numa_node``.
4. No GPUs.

NUMA nodes always come from ``/sys/devices/system/node/node*/`` (``cpulist``, ``meminfo``,
``distance``); a machine without that directory is one node holding every CPU.

JSON schema (``"version"`` optional, must be 1 when given)::

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

A bad file raises :class:`TopologyError` naming the field (``numa_nodes[1].cpus``).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.exceptions import ConfigError

UNKNOWN_NUMA = -1
LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20  # assumed when a topology gives no distances

SYS_NODE_DIR = Path("/sys/devices/system/node")
SYS_CPU_DIR = Path("/sys/devices/system/cpu")
SYS_PCI_DIR = Path("/sys/bus/pci/devices")
PROC_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


class TopologyError(ConfigError):
    """A topology file (``RAYGUARD_TOPOLOGY``) is missing or does not match the schema."""


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


# ---------------------------------------------------------------------------- cpulists


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise ValueError(f"range {part!r} runs backwards")
            cpus.extend(range(lo, hi + 1))
        else:
            cpus.append(int(part))
    return cpus


def format_cpulist(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


# ---------------------------------------------------------------------------- JSON form


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


# ---------------------------------------------------------------------------- discovery


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` and sysfs' ``0000:18:00.0`` -> ``0000:18:00.0``."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}" if rest else bus_id


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def pci_numa_node(bus_id: str, pci_dir: Path = SYS_PCI_DIR) -> int:
    value = _read(pci_dir / normalize_bus_id(bus_id) / "numa_node")
    try:
        return int(value) if value is not None else UNKNOWN_NUMA
    except ValueError:
        return UNKNOWN_NUMA


def _smt_order(cpus: list[int], cpu_dir: Path) -> tuple[int, ...]:
    """Order CPUs so that hyperthread siblings are adjacent: 0,32,1,33,..."""
    def key(cpu: int) -> tuple[int, int]:
        text = _read(cpu_dir / f"cpu{cpu}" / "topology" / "thread_siblings_list")
        try:
            first = min(parse_cpulist(text)) if text else cpu
        except ValueError:
            first = cpu
        return (first, cpu)

    return tuple(sorted(cpus, key=key))


def discover_numa_nodes(node_dir: Path = SYS_NODE_DIR,
                        cpu_dir: Path = SYS_CPU_DIR) -> tuple[NumaNode, ...]:
    """NUMA nodes from sysfs; one node with every online CPU when sysfs has none."""
    nodes = []
    dirs = sorted((p for p in node_dir.glob("node[0-9]*") if p.name[4:].isdigit()),
                  key=lambda p: int(p.name[4:]))
    for d in dirs:
        cpus = parse_cpulist(_read(d / "cpulist") or "")
        mem_kb = None
        for line in (_read(d / "meminfo") or "").splitlines():
            if "MemTotal:" in line:
                mem_kb = int(line.split()[-2])
        row = [int(x) for x in (_read(d / "distance") or "").split()]
        nodes.append((int(d.name[4:]), cpus, mem_kb, row))
    if not nodes:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
            range(os.cpu_count() or 1))
        return (NumaNode(0, tuple(cpus)),)
    ids = [n[0] for n in nodes]
    return tuple(
        NumaNode(i, _smt_order(cpus, cpu_dir), mem // 1024 if mem is not None else None,
                 dict(zip(ids, row, strict=True)) if len(row) == len(ids) else {})
        for i, cpus, mem, row in nodes
    )


def discover_gpus_nvml() -> tuple[GpuInfo, ...] | None:
    """GPUs through NVML, or None when ``pynvml`` is missing or NVML does not start."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            bus = normalize_bus_id(bus.decode() if isinstance(bus, bytes) else bus)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            gpus.append(GpuInfo(i, pci_numa_node(bus), bus, uuid))
        return tuple(gpus)
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def discover_gpus_sysfs(proc_dir: Path = PROC_NVIDIA_GPUS,
                        pci_dir: Path = SYS_PCI_DIR) -> tuple[GpuInfo, ...]:
    """NVIDIA GPUs from the driver's /proc entries or the PCI tree, indexed in bus order."""
    buses = [normalize_bus_id(p.name) for p in proc_dir.glob("*")] if proc_dir.is_dir() else []
    if not buses and pci_dir.is_dir():
        for dev in pci_dir.iterdir():
            vendor, cls = _read(dev / "vendor"), _read(dev / "class") or ""
            if vendor == "0x10de" and cls.startswith(("0x0300", "0x0302")):
                buses.append(normalize_bus_id(dev.name))
    return tuple(GpuInfo(i, pci_numa_node(b, pci_dir), b) for i, b in enumerate(sorted(buses)))


def discover_topology(environ: Mapping[str, str] | None = None) -> Topology:
    """This node's topology: the override file if ``RAYGUARD_TOPOLOGY`` is set, else NVML,
    else sysfs. Raises :class:`TopologyError` only for a bad override file."""
    env = os.environ if environ is None else environ
    override = env.get(TOPOLOGY_ENV_VAR, "")
    if override:
        return load_topology_file(override)
    nodes = discover_numa_nodes()
    gpus = discover_gpus_nvml()
    source = "nvml"
    if gpus is None:
        gpus, source = discover_gpus_sysfs(), "sysfs"
    if not gpus:
        source = "none"
    return Topology(nodes, gpus, source, socket.gethostname())
