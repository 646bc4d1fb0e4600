"""Checks across nodes: versions, environment, PYTHONPATH, storage, GPU counts, clocks.

Pure functions over the list of NodeProbes; clock windows (when the driver sent the probe
and received its answer) come from the runner.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from rayguard.doctor.findings import Finding
from rayguard.doctor.probe import NodeProbe

# version key -> severity when nodes differ
VERSION_SEVERITY = {"python": "error", "torch": "error", "torch_cuda": "error", "nccl": "error",
                    "ray": "error", "rayguard": "error", "driver": "warning"}
DRIFT_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG", "GLOO_SOCKET_IFNAME",
                      "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYGUARD_", "CUDA_DEVICE_MAX_CONNECTIONS")
CONSISTENT_VARS = ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_MIN_FREE_BYTES = 5 * 1024**3
DEFAULT_MAX_SKEW_S = 2.0


def _groups(values: Mapping[str, str]) -> str:
    by_value: dict[str, list[str]] = {}
    for node, value in values.items():
        by_value.setdefault(value, []).append(node)
    return "; ".join(f"{v} on {', '.join(sorted(ns))}" for v, ns in sorted(by_value.items()))


def check_versions(probes: Sequence[NodeProbe]) -> list[Finding]:
    out = []
    for key, severity in VERSION_SEVERITY.items():
        values = {p.node: p.versions.get(key, "absent") for p in probes}
        if len(set(values.values())) < 2:
            continue
        if key == "python" and len({v.rsplit(".", 1)[0] for v in values.values()}) == 1:
            severity = "warning"  # patch releases only
        out.append(Finding("DRIFT_VERSION", severity, key,  # type: ignore[arg-type]
                           f"{key} differs between nodes: {_groups(values)}",
                           f"install the same {key} version on every node (same image/venv)"))
    return out


def check_env_drift(probes: Sequence[NodeProbe]) -> list[Finding]:
    out = []
    names = sorted({n for p in probes for n in p.env})
    for name in names:
        values = {p.node: p.env.get(name, "<unset>") for p in probes}
        if len(set(values.values())) < 2:
            continue
        if name in CONSISTENT_VARS and "<unset>" not in values.values():
            out.append(Finding("PROC_INCONSISTENT", "error", name,
                               f"{name} differs between nodes: {_groups(values)}",
                               f"every process of one job needs the same {name}"))
        elif name.startswith(DRIFT_ENV_PREFIXES):
            out.append(Finding("DRIFT_ENV", "warning", name,
                               f"{name} differs between nodes: {_groups(values)}",
                               f"set {name} the same way on every node (or through the run's "
                               "runtime_env env_vars)"))
    return out


def check_pythonpath(probes: Sequence[NodeProbe]) -> list[Finding]:
    out = []
    entries = {p.node: [e for e in p.env.get("PYTHONPATH", "").split(os.pathsep) if e] for p in probes}
    everywhere = set.intersection(*(set(v) for v in entries.values())) if entries else set()
    for entry in sorted({e for v in entries.values() for e in v} - everywhere):
        have = sorted(n for n, v in entries.items() if entry in v)
        lack = sorted(n for n, v in entries.items() if entry not in v)
        out.append(Finding("DRIFT_PYTHONPATH", "warning", "PYTHONPATH",
                           f"PYTHONPATH entry {entry!r} is set on {', '.join(have)} but not on "
                           f"{', '.join(lack)}: imports differ between ranks",
                           "set PYTHONPATH identically (runtime_env env_vars or working_dir)"))
    for p in probes:
        for entry in p.pythonpath_missing:
            out.append(Finding("PYTHONPATH_MISSING_ENTRY", "warning", "PYTHONPATH",
                               f"PYTHONPATH entry {entry!r} does not exist on this node",
                               "sync the code to every node, or ship it with runtime_env "
                               "working_dir/py_modules", p.node))
    return out


def check_storage(probes: Sequence[NodeProbe], *, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES) -> list[Finding]:
    out = []
    for p in probes:
        if p.storage_exists is False:
            out.append(Finding("STORAGE_MISSING", "error", "storage_path",
                               f"storage path {p.storage_path!r} does not exist on this node: "
                               "checkpoints written there are lost or fail",
                               "use shared storage mounted at the same path on every node "
                               "(NFS, or a cloud URI like s3://...)", p.node))
        elif p.storage_free_bytes is not None and p.storage_free_bytes < min_free_bytes:
            out.append(Finding("STORAGE_LOW_SPACE", "warning", "storage_path",
                               f"only {p.storage_free_bytes / 1024**3:.1f} GiB free on "
                               f"{p.storage_path!r} (threshold {min_free_bytes / 1024**3:.1f} GiB)",
                               "free space or point storage_path elsewhere before checkpoints "
                               "start failing", p.node))
    return out


def check_gpu_counts(probes: Sequence[NodeProbe]) -> list[Finding]:
    counts = {p.node: str(len(p.gpus)) for p in probes if p.gpus is not None}
    if len(set(counts.values())) < 2:
        return []
    return [Finding("DRIFT_GPU_COUNT", "info", "gpus", f"GPU count differs: {_groups(counts)}",
                    "fine for heterogeneous clusters; otherwise check for a lost GPU "
                    "(nvidia-smi, dmesg Xid errors)")]


def clock_skew_s(clock_s: float, sent_s: float, received_s: float) -> float:
    """A lower bound of the node's clock offset: how far its reading lies outside the
    interval in which the driver knows the probe ran."""
    return max(0.0, sent_s - clock_s, clock_s - received_s)


def check_clocks(probes: Sequence[NodeProbe], windows: Mapping[str, tuple[float, float]],
                 *, max_skew_s: float = DEFAULT_MAX_SKEW_S) -> list[Finding]:
    out = []
    for p in probes:
        if p.node not in windows:
            continue
        skew = clock_skew_s(p.clock_s, *windows[p.node])
        if skew > max_skew_s:
            out.append(Finding("CLOCK_SKEW", "warning", "clock",
                               f"the node's clock is at least {skew:.1f} s off the driver's",
                               "run NTP/chrony on every node; skew scrambles logs, event order "
                               "and timeout decisions", p.node))
    return out


def check_drift(probes: Sequence[NodeProbe], *, windows: Mapping[str, tuple[float, float]] | None = None,
                min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
                max_skew_s: float = DEFAULT_MAX_SKEW_S) -> list[Finding]:
    """Every cross-node check (storage and PYTHONPATH existence are per node but need the
    whole picture to phrase)."""
    multi = len(probes) > 1
    return ((check_versions(probes) + check_env_drift(probes) + check_gpu_counts(probes)
             if multi else [])
            + check_pythonpath(probes) + check_storage(probes, min_free_bytes=min_free_bytes)
            + check_clocks(probes, windows or {}, max_skew_s=max_skew_s))
