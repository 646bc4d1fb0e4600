"""OMP_NUM_THREADS / MKL_NUM_THREADS against the node's cores and local worker count."""

from __future__ import annotations

from rayguard.doctor.findings import Finding
from rayguard.doctor.probe import NodeProbe

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def local_workers(probe: NodeProbe, local_world_size: int | None = None) -> int:
    """Processes sharing this node: the argument, else LOCAL_WORLD_SIZE, else 1."""
    if local_world_size:
        return local_world_size
    try:
        return max(1, int(probe.env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_threads(probe: NodeProbe, *, local_world_size: int | None = None) -> list[Finding]:
    out = []
    workers = local_workers(probe, local_world_size)
    for name in THREAD_VARS:
        raw = probe.env.get(name)
        if raw is None:
            continue
        first = raw.split(",")[0].strip()  # OpenMP allows a nesting list "8,2"
        if not first.isdigit() or int(first) < 1:
            out.append(Finding("THREADS_BAD_VALUE", "error", name,
                               f"{name}={raw!r} is not a positive integer",
                               f"set {name} to cores / local workers, e.g. "
                               f"{max(1, probe.cpu_count // workers)}"))
            continue
        total = int(first) * workers
        if total > probe.cpu_count:
            out.append(Finding("THREADS_OVERSUBSCRIBED", "warning", name,
                               f"{name}={first} x {workers} local worker(s) = {total} threads on "
                               f"{probe.cpu_count} core(s): threads contend, data loading and "
                               "collectives slow down",
                               f"set {name}={max(1, probe.cpu_count // workers)} (cores / local workers)"))
    return out
