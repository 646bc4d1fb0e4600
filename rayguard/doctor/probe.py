"""What a node reports to the doctor: a plain record, and the thin code that reads the machine.

Every check in :mod:`rayguard.doctor` is a pure function over :class:`NodeProbe`, so tests
craft probes by hand; only :func:`probe_local` touches the real machine, reading GPUs and
NUMA nodes through :mod:`rayguard.placement.discovery` (the discovery NUMA placement uses).
The probe never imports torch (versions are read from the installed packages' metadata and
``torch/version.py``), so it stays fast on CPU nodes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rayguard.placement.discovery import (
    gpus_from_nvidia_smi,
    gpus_from_proc,
    numa_node_ids,
    nvidia_device_files,
)
from rayguard.placement.model import GpuInfo


@dataclass
class NodeProbe:
    """Everything the checks need to know about one node (or one worker process)."""

    node: str = ""
    """How findings name the node: ``hostname`` (plus the Ray node id's prefix on a cluster)."""
    hostname: str = ""
    env: dict[str, str] = field(default_factory=dict)
    interfaces: list[str] = field(default_factory=list)
    ib_devices: list[str] = field(default_factory=list)
    gpus: list[GpuInfo] | None = None
    """Physical GPUs; ``None`` when unknown (then GPU-count checks are skipped)."""
    cpu_count: int = 1
    """Cores this process may run on (``sched_getaffinity``)."""
    numa_nodes: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    """python, torch, torch_cuda, nccl, driver, ray, rayguard (absent: not installed/unknown)."""
    storage_path: str | None = None
    storage_exists: bool | None = None
    storage_free_bytes: int | None = None
    pythonpath_missing: list[str] = field(default_factory=list)
    """PYTHONPATH entries that do not exist on this node."""
    clock_s: float = 0.0
    """``time.time()`` when the probe ran (compared with the driver's clock)."""
    master_resolved: list[str] | None = None
    """Addresses MASTER_ADDR resolved to; ``None``: not attempted; ``[]``: failed."""
    master_connect: str | None = None
    """``ok``, ``refused``, ``timeout``, ``error: ...``; ``None``: not attempted."""
    process_group: bool | None = None
    """True when this process already has torch.distributed's default process group (the
    rendezvous is done, whatever its init_method); ``None``: not known (not a worker)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeProbe:
        data = dict(data)
        if data.get("gpus") is not None:
            data["gpus"] = [GpuInfo(**g) for g in data["gpus"]]
        return cls(**data)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _interfaces() -> list[str]:
    try:
        import psutil

        return sorted(psutil.net_if_addrs())
    except Exception:
        return sorted(name for _, name in socket.if_nameindex())


def _ib_devices(root: str = "/sys/class/infiniband") -> list[str]:
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", f.read())
            return m.group(1) if m else None
    except OSError:
        return None


def _dist_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def _torch_cuda_version() -> str | None:
    """torch.version.cuda without importing torch (reads torch/version.py)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path) as f:
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def versions() -> dict[str, str]:
    found = {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "torch_cuda": _torch_cuda_version(),
        "nccl": _dist_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"),
        "driver": _driver_version(),
        "ray": _dist_version("ray"),
        "rayguard": _dist_version("rayguard"),
    }
    return {k: v for k, v in found.items() if v}


def gpus(deep: bool = True) -> list[GpuInfo] | None:
    """The node's physical GPUs: procfs first, nvidia-smi when ``deep``; [] if none; None
    when ``/dev/nvidia*`` exists but neither source could list them."""
    found = gpus_from_proc()
    if deep and not found:
        found = gpus_from_nvidia_smi() or found
    if found is None:
        return None if nvidia_device_files() else []
    return list(found)


def _storage(path: str | None) -> tuple[bool | None, int | None]:
    if not path or "://" in path:
        return None, None  # cloud URIs are not checked from the node
    if not os.path.exists(path):
        return False, None
    try:
        return True, shutil.disk_usage(path).free
    except OSError:
        return True, None


def _master_network(env: Mapping[str, str], connect_timeout_s: float) -> tuple[list[str] | None, str | None]:
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if not addr:
        return None, None
    try:
        resolved = sorted({str(i[4][0]) for i in socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError):
        return [], None
    if connect_timeout_s <= 0 or not port.isdigit() or not 0 < int(port) < 65536:
        return resolved, None
    try:
        with socket.create_connection((addr, int(port)), timeout=connect_timeout_s):
            return resolved, "ok"
    except ConnectionRefusedError:
        return resolved, "refused"
    except TimeoutError:
        return resolved, "timeout"
    except OSError as exc:
        return resolved, f"error: {exc}"


def process_group_initialized() -> bool | None:
    """Whether torch.distributed's default process group exists in this process; ``None``
    when torch.distributed was never imported here (it is not imported to find out)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch: unknown
        return None


def probe_local(env: Mapping[str, str] | None = None, *, storage_path: str | None = None,
                deep: bool = True, network: bool = True, connect_timeout_s: float = 1.0,
                node: str = "") -> NodeProbe:
    """Read this machine. ``deep=False`` skips nvidia-smi; ``network=False`` skips DNS/TCP."""
    env = dict(os.environ if env is None else env)
    hostname = socket.gethostname()
    resolved, connect = _master_network(env, connect_timeout_s) if network else (None, None)
    exists, free = _storage(storage_path)
    pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return NodeProbe(
        node=node or hostname, hostname=hostname, env=env, interfaces=_interfaces(),
        ib_devices=_ib_devices(), gpus=gpus(deep), cpu_count=_usable_cpus(),
        numa_nodes=max(1, len(numa_node_ids())), versions=versions() if deep else {},
        storage_path=storage_path, storage_exists=exists, storage_free_bytes=free,
        pythonpath_missing=[p for p in pp if not os.path.exists(p)], clock_s=time.time(),
        master_resolved=resolved, master_connect=connect,
        process_group=process_group_initialized(),
    )


def probe_on_node(env: Mapping[str, str] | None, storage_path: str | None,
                  connect_timeout_s: float, ray_node_id: str) -> dict[str, Any]:
    """Body of the doctor's Ray task: this node's record as a plain dict, with ``env`` laid
    over the worker's environment. Uses the standard library (and psutil, optionally) and
    :mod:`rayguard.placement.discovery` only, so the runner ships both by value
    (:data:`rayguard.doctor.runner.SHIPPED_MODULES`) and nodes never import rayguard."""
    merged = dict(os.environ)
    merged.update(env or {})
    probe = probe_local(merged, storage_path=storage_path, connect_timeout_s=connect_timeout_s)
    probe.node = f"{probe.hostname}/{ray_node_id[:8]}"
    return probe.to_dict()


__all__ = ["GpuInfo", "NodeProbe", "gpus", "probe_local", "probe_on_node", "versions"]
