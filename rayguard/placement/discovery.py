"""Read this machine's GPUs and NUMA nodes: sysfs, procfs, NVML and ``nvidia-smi``.

One discovery for both users: the NUMA planner (through
:func:`rayguard.placement.topology.discover_topology`, which adds the ``RAYGUARD_TOPOLOGY``
override) and the doctor, whose probe task ships this module *by value* to every node.
So it imports the standard library only, plus the equally plain
:mod:`rayguard.placement.model` and :mod:`rayguard.placement.cpulist` (shipped with it);
``pynvml`` is optional and imported inside :func:`discover_gpus_nvml`. It never creates a
CUDA context.

Sources:

* NUMA nodes: ``/sys/devices/system/node/node*/`` (``cpulist``, ``meminfo``,
  ``distance``); a machine without that directory is one node holding every CPU.
* GPUs: NVML (``pynvml`` / ``nvidia-ml-py``); the driver's ``/proc/driver/nvidia/gpus/<bus>``
  (UUID and model from its ``information`` file); NVIDIA display/3D controllers under
  ``/sys/bus/pci/devices``; ``nvidia-smi``. Each GPU's NUMA node comes from
  ``/sys/bus/pci/devices/<bus>/numa_node``.

Callers choose the order: :func:`discover_machine` is the planner's (NVML, else procfs,
else the PCI tree); the doctor's probe uses procfs, then ``nvidia-smi``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from rayguard.placement.cpulist import parse_cpulist
from rayguard.placement.model import UNKNOWN_NUMA, GpuInfo, NumaNode, Topology, normalize_bus_id

SYS_NODE_DIR = Path("/sys/devices/system/node")
SYS_CPU_DIR = Path("/sys/devices/system/cpu")
SYS_PCI_DIR = Path("/sys/bus/pci/devices")
PROC_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
DEV_DIR = Path("/dev")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


# ---------------------------------------------------------------------------- NUMA nodes


def numa_node_ids(node_dir: Path = SYS_NODE_DIR) -> list[int]:
    """The ids of sysfs' ``node<N>`` directories, ascending; [] when there are none."""
    try:
        names = [p.name for p in node_dir.iterdir()]
    except OSError:
        return []
    return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())


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


def _memory_mb(meminfo: str) -> int | None:
    mem_kb = None
    for line in meminfo.splitlines():
        if "MemTotal:" in line:
            mem_kb = int(line.split()[-2])
    return mem_kb // 1024 if mem_kb is not None else None


def discover_numa_nodes(node_dir: Path = SYS_NODE_DIR,
                        cpu_dir: Path = SYS_CPU_DIR) -> tuple[NumaNode, ...]:
    """NUMA nodes from sysfs; one node with every usable CPU when sysfs has none."""
    ids = numa_node_ids(node_dir)
    if not ids:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
            range(os.cpu_count() or 1))
        return (NumaNode(0, tuple(cpus)),)
    nodes = []
    for i in ids:
        d = node_dir / f"node{i}"
        cpus = parse_cpulist(_read(d / "cpulist") or "")
        row = [int(x) for x in (_read(d / "distance") or "").split()]
        nodes.append(NumaNode(i, _smt_order(cpus, cpu_dir), _memory_mb(_read(d / "meminfo") or ""),
                              dict(zip(ids, row, strict=True)) if len(row) == len(ids) else {}))
    return tuple(nodes)


# ---------------------------------------------------------------------------- GPUs


def pci_numa_node(bus_id: str, pci_dir: Path = SYS_PCI_DIR) -> int:
    """The NUMA node of a PCI device (any bus id spelling); ``-1`` when sysfs does not say."""
    value = _read(pci_dir / normalize_bus_id(bus_id) / "numa_node")
    try:
        return int(value) if value is not None else UNKNOWN_NUMA
    except ValueError:
        return UNKNOWN_NUMA


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


def _information(path: Path) -> dict[str, str]:
    """``Key: value`` lines of a ``/proc/driver/nvidia/gpus/<bus>/information`` file."""
    info: dict[str, str] = {}
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def gpus_from_proc(proc_dir: Path = PROC_NVIDIA_GPUS,
                   pci_dir: Path = SYS_PCI_DIR) -> tuple[GpuInfo, ...] | None:
    """GPUs from the driver's procfs, indexed in bus order (cheap; no CUDA context).
    None when the directory is missing (no driver loaded)."""
    try:
        buses = sorted(normalize_bus_id(p.name) for p in proc_dir.iterdir())
    except OSError:
        return None
    gpus = []
    for i, bus in enumerate(buses):
        info = _information(proc_dir / bus / "information")
        gpus.append(GpuInfo(i, pci_numa_node(bus, pci_dir), bus, info.get("GPU UUID") or None,
                            info.get("Model") or None))
    return tuple(gpus)


def gpus_from_pci(pci_dir: Path = SYS_PCI_DIR) -> tuple[GpuInfo, ...]:
    """NVIDIA display/3D controllers in the PCI tree (found even without a driver), in bus
    order; NVSwitch bridges and other vendors' devices are left out."""
    buses = []
    if pci_dir.is_dir():
        for dev in pci_dir.iterdir():
            vendor, cls = _read(dev / "vendor"), _read(dev / "class") or ""
            if vendor == "0x10de" and cls.startswith(("0x0300", "0x0302")):
                buses.append(normalize_bus_id(dev.name))
    return tuple(GpuInfo(i, pci_numa_node(b, pci_dir), b) for i, b in enumerate(sorted(buses)))


def discover_gpus_sysfs(proc_dir: Path = PROC_NVIDIA_GPUS,
                        pci_dir: Path = SYS_PCI_DIR) -> tuple[GpuInfo, ...]:
    """NVIDIA GPUs from the driver's /proc entries or, failing that, the PCI tree."""
    return gpus_from_proc(proc_dir, pci_dir) or gpus_from_pci(pci_dir)


def gpus_from_nvidia_smi(timeout_s: float = 5.0,
                         pci_dir: Path = SYS_PCI_DIR) -> tuple[GpuInfo, ...] | None:
    """GPUs as ``nvidia-smi`` lists them; None when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=index,uuid,name,pci.bus_id",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out, pci_dir)


def parse_nvidia_smi(out: str, pci_dir: Path = SYS_PCI_DIR) -> tuple[GpuInfo, ...]:
    """``index, uuid, name, pci.bus_id`` CSV lines (``--format=csv,noheader``) -> GPUs."""
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            index, uuid, name, bus = parts
            gpus.append(GpuInfo(int(index), pci_numa_node(bus, pci_dir), normalize_bus_id(bus),
                                uuid or None, name or None))
    return tuple(gpus)


def nvidia_device_files(dev_dir: Path = DEV_DIR) -> bool:
    """Whether any ``/dev/nvidia0`` .. ``/dev/nvidia7`` exists (GPUs may be present even
    though no source above could list them)."""
    return any((dev_dir / f"nvidia{i}").exists() for i in range(8))


def discover_machine() -> Topology:
    """This machine's topology: NUMA nodes from sysfs; GPUs from NVML, else sysfs."""
    nodes = discover_numa_nodes()
    gpus = discover_gpus_nvml()
    source = "nvml"
    if gpus is None:
        gpus, source = discover_gpus_sysfs(), "sysfs"
    if not gpus:
        source = "none"
    return Topology(nodes, gpus, source, socket.gethostname())


__all__ = ["PROC_NVIDIA_GPUS", "SYS_CPU_DIR", "SYS_NODE_DIR", "SYS_PCI_DIR", "discover_gpus_nvml",
           "discover_gpus_sysfs", "discover_machine", "discover_numa_nodes", "gpus_from_nvidia_smi",
           "gpus_from_pci", "gpus_from_proc", "numa_node_ids", "nvidia_device_files",
           "parse_nvidia_smi", "pci_numa_node"]
