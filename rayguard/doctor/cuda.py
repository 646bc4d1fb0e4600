"""Checks of CUDA_VISIBLE_DEVICES, the GPUs and their NUMA nodes, and whether the driver,
torch's CUDA and NCCL fit together. Pure functions over a NodeProbe.

CUDA_VISIBLE_DEVICES is parsed by :mod:`rayguard.placement.visible_devices`, the parser the
worker's device pinning uses; this module turns its classified entries into findings."""

from __future__ import annotations

import re

from rayguard.doctor.findings import Finding
from rayguard.doctor.probe import NodeProbe
from rayguard.placement.visible_devices import DeviceEntry, duplicate_keys, parse_visible_devices

# Oldest Linux driver that runs any CUDA toolkit of a major version (minor-version
# compatibility; NVIDIA's CUDA release notes, table 2).
MIN_DRIVER_FOR_CUDA_MAJOR = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


def _entry_findings(entries: list[DeviceEntry], probe: NodeProbe, value: str) -> list[Finding]:
    out = []
    subject = "CUDA_VISIBLE_DEVICES"
    for i, e in enumerate(entries):
        if e.kind in ("invalid", "empty"):
            out.append(Finding("CVD_INVALID_ENTRY", "error", subject,
                               f"CUDA_VISIBLE_DEVICES={value!r}: entry {e.raw!r} is neither an "
                               "index, a GPU-<uuid> nor a MIG-<uuid>; CUDA ignores it and every "
                               "entry after it",
                               "use comma-separated indices (0,1) or UUIDs from `nvidia-smi -L`"))
            break
        if e.negative:
            out.append(Finding("CVD_HIDES_ALL" if i == 0 else "CVD_INVALID_ENTRY",
                               "info" if i == 0 else "error", subject,
                               f"CUDA_VISIBLE_DEVICES={value!r}: a negative index hides "
                               f"{'every GPU' if i == 0 else 'every GPU after it'}",
                               "fine for CPU-only processes; otherwise list the GPUs to use"))
            break
    dups = duplicate_keys(e.raw for e in entries)
    if dups:
        out.append(Finding("CVD_DUPLICATE", "error", subject,
                           f"CUDA_VISIBLE_DEVICES={value!r} names {', '.join(dups)} more than "
                           "once; CUDA then exposes no device at all",
                           "list each GPU once"))
    return out


def _presence_findings(entries: list[DeviceEntry], probe: NodeProbe, value: str) -> list[Finding]:
    if probe.gpus is None:
        return []
    subject, n = "CUDA_VISIBLE_DEVICES", len(probe.gpus)
    valid = [e for e in entries if e.names_a_device]
    if n == 0:
        if valid:
            return [Finding("CVD_NO_GPUS", "warning", subject,
                            f"CUDA_VISIBLE_DEVICES={value!r} but the node has no NVIDIA GPU",
                            "unset it on CPU nodes, or schedule GPU work on GPU nodes")]
        return []
    out = []
    beyond = [e.raw for e in valid if e.kind == "index" and int(e.raw) >= n]
    if beyond:
        out.append(Finding("CVD_OUT_OF_RANGE", "error", subject,
                           f"CUDA_VISIBLE_DEVICES={value!r} names index {', '.join(beyond)} but "
                           f"the node has {n} GPU(s) (0..{n - 1}): 'invalid device ordinal'",
                           f"use indices 0..{n - 1}; let Ray assign GPUs (num_gpus / use_gpu=True)"))
    uuids = [g.uuid.lower() for g in probe.gpus if g.uuid]
    if uuids:
        unknown = [e.raw for e in valid if e.kind == "uuid"
                   and not any(u.startswith(e.raw.lower()) for u in uuids)]
        if unknown:
            out.append(Finding("CVD_UNKNOWN_UUID", "error", subject,
                               f"CUDA_VISIBLE_DEVICES names {', '.join(unknown)}, which is not a "
                               "GPU of this node", "copy the UUIDs from `nvidia-smi -L` on this node"))
    return out


def check_visible_devices(probe: NodeProbe) -> list[Finding]:
    """CUDA_VISIBLE_DEVICES: syntax, duplicates, ids beyond the GPUs present."""
    value = probe.env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return []
    entries = parse_visible_devices(value)
    return _entry_findings(entries, probe, value) + _presence_findings(entries, probe, value)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def check_gpu_stack(probe: NodeProbe) -> list[Finding]:
    """GPUs and NUMA nodes; driver vs torch's CUDA; NCCL present for CUDA torch."""
    if not probe.gpus:
        return []
    out, v = [], probe.versions
    if probe.numa_nodes > 1:
        unknown = [str(g.index) for g in probe.gpus if g.numa_node is None or g.numa_node < 0]
        if unknown:
            out.append(Finding("GPU_NUMA_UNKNOWN", "info", "numa",
                               f"GPU(s) {', '.join(unknown)} report no NUMA node on a machine with "
                               f"{probe.numa_nodes} NUMA nodes", "CPU/memory binding cannot follow "
                               "these GPUs; check the BIOS/VM exposes ACPI SRAT/PCI locality"))
    if "torch" in v and not v.get("torch_cuda"):
        out.append(Finding("TORCH_CPU_BUILD_ON_GPU_NODE", "error", "torch",
                           f"the node has {len(probe.gpus)} GPU(s) but torch {v['torch']} is a "
                           "CPU-only build", "install a CUDA build of torch (pip index "
                           "https://download.pytorch.org/whl/cuXXX)"))
    cuda, driver = v.get("torch_cuda"), v.get("driver")
    if cuda and driver:
        major = _version_tuple(cuda)[0]
        need = MIN_DRIVER_FOR_CUDA_MAJOR.get(major)
        if need and _version_tuple(driver) < need:
            out.append(Finding("CUDA_DRIVER_TOO_OLD", "error", "driver",
                               f"driver {driver} is older than {'.'.join(map(str, need))}, the "
                               f"minimum for CUDA {major}.x (torch built with CUDA {cuda})",
                               "upgrade the NVIDIA driver or install a torch built for an older CUDA"))
    if cuda and "nccl" not in v:
        out.append(Finding("NCCL_NOT_FOUND", "info", "nccl",
                           f"torch is built with CUDA {cuda} but no nvidia-nccl package was found",
                           "install the nvidia-nccl-cuXX wheel matching torch (pip install torch "
                           "pulls it in), or make sure a system NCCL is on LD_LIBRARY_PATH"))
    return out


def check_cuda(probe: NodeProbe) -> list[Finding]:
    return check_visible_devices(probe) + check_gpu_stack(probe)
