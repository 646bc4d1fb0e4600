"""A finding: one thing the doctor noticed, with a stable code, where, and the fix.

Checks return lists of :class:`Finding`; the report sorts, prints and serialises them.
``CODES`` lists every code a check can emit with a one-line summary (docs and tests use it).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One result of a check."""

    code: str
    """Stable identifier, e.g. ``NCCL_IFNAME_NO_MATCH`` (see ``CODES``)."""

    severity: Severity
    """``error``: the run will fail or hang; ``warning``: likely wrong or slow; ``info``."""

    subject: str
    """The variable or component concerned, e.g. ``NCCL_SOCKET_IFNAME`` or ``torch``."""

    message: str
    """What is wrong, with the offending value."""

    fix: str
    """What to do about it."""

    node: str = ""
    """The node (hostname/IP or Ray node id) the finding belongs to; ``""`` for cluster-wide."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding(severity={self.severity!r}): must be one of {SEVERITIES}")

    def on(self, node: str) -> Finding:
        """The same finding attributed to ``node``."""
        return replace(self, node=node)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(**{k: data[k] for k in ("code", "severity", "subject", "message", "fix", "node")
                      if k in data})


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a likely misspelling, or None."""
    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return match[0] if match else None


# Every code a check can emit, with the family module that owns it.
CODES: dict[str, str] = {
    # process_env.py
    "PROC_NOT_INT": "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/NODE_RANK is not an integer",
    "PROC_OUT_OF_RANGE": "a rank is negative or not below its world size",
    "PROC_MISSING": "a rendezvous variable is set without the others env:// needs",
    "PROC_NO_MASTER": "RANK/WORLD_SIZE without MASTER_*: right for tcp://, not for env://",
    "MASTER_PORT_INVALID": "MASTER_PORT is not a port number (1-65535)",
    "MASTER_PORT_PRIVILEGED": "MASTER_PORT below 1024 needs root",
    "MASTER_ADDR_UNRESOLVABLE": "MASTER_ADDR does not resolve on this node",
    "MASTER_ADDR_LOOPBACK": "MASTER_ADDR is a loopback address in a multi-node job",
    "MASTER_UNREACHABLE": "a TCP connect to MASTER_ADDR:MASTER_PORT timed out or failed",
    "MASTER_NOT_LISTENING": "nothing listens on MASTER_ADDR:MASTER_PORT yet",
    "TORCH_DISTRIBUTED_DEBUG_INVALID": "TORCH_DISTRIBUTED_DEBUG is not OFF, INFO or DETAIL",
    "TORCH_DISTRIBUTED_DEBUG_ON": "TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL slows collectives",
    # cuda.py
    "CVD_INVALID_ENTRY": "CUDA_VISIBLE_DEVICES has an entry CUDA cannot parse",
    "CVD_DUPLICATE": "CUDA_VISIBLE_DEVICES names the same device twice",
    "CVD_OUT_OF_RANGE": "CUDA_VISIBLE_DEVICES names a GPU index the node does not have",
    "CVD_UNKNOWN_UUID": "CUDA_VISIBLE_DEVICES names a GPU UUID the node does not have",
    "CVD_HIDES_ALL": "CUDA_VISIBLE_DEVICES hides every GPU",
    "CVD_NO_GPUS": "CUDA_VISIBLE_DEVICES names GPUs on a node without any",
    "GPU_NUMA_UNKNOWN": "a GPU's NUMA node is unknown on a multi-NUMA machine",
    "TORCH_CPU_BUILD_ON_GPU_NODE": "the node has GPUs but torch is a CPU-only build",
    "CUDA_DRIVER_TOO_OLD": "the NVIDIA driver is older than torch's CUDA needs",
    "NCCL_NOT_FOUND": "torch has CUDA but no NCCL library version was found",
    # nccl.py
    "NCCL_BAD_VALUE": "an NCCL_*/TORCH_NCCL_* variable has a value of the wrong type",
    "NCCL_IFNAME_NO_MATCH": "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME matches no interface",
    "NCCL_IFNAME_LOOPBACK_ONLY": "the socket interface filter leaves only loopback",
    "NCCL_IB_HCA_NO_MATCH": "NCCL_IB_HCA matches no InfiniBand device",
    "NCCL_IB_NO_DEVICES": "NCCL_IB_DISABLE=0 but the node has no InfiniBand device",
    "NCCL_IB_DISABLED_WITH_IB": "NCCL_IB_DISABLE=1 on a node with InfiniBand devices",
    "NCCL_SOCKET_THREADS_RANGE": "NCCL_SOCKET_NTHREADS or NCCL_NSOCKS_PERTHREAD out of bounds",
    "NCCL_SOCKET_THREADS_PRODUCT": "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD > 64",
    "NCCL_SOCKET_THREADS_WITH_IB": "socket threads tuned while InfiniBand carries the traffic",
    "NCCL_DEPRECATED_VAR": "a deprecated NCCL/TORCH_NCCL variable name",
    "NCCL_UNKNOWN_VAR": "an NCCL_*/TORCH_NCCL_* name that NCCL/torch do not read",
    "NCCL_TIMEOUT_SMALL": "an NCCL/torch timeout unusually small for the cluster size",
    "NCCL_TIMEOUT_LARGE": "an NCCL/torch timeout so large that a hang is found late",
    "NCCL_DEBUG_ON": "NCCL_DEBUG=INFO/TRACE left on",
    "NCCL_NO_ERROR_HANDLING": "async error handling and blocking wait both off: timeouts hang",
    # threads.py
    "THREADS_BAD_VALUE": "OMP_NUM_THREADS/MKL_NUM_THREADS is not a positive integer",
    "THREADS_OVERSUBSCRIBED": "threads x local workers exceeds the node's cores",
    # rayguard_env.py
    "RAYGUARD_UNKNOWN_VAR": "a RAYGUARD_* variable rayguard does not read (misspelling?)",
    # drift.py
    "DRIFT_VERSION": "python/torch/CUDA/NCCL/ray/rayguard versions differ between nodes",
    "DRIFT_ENV": "an NCCL/torch/thread/rayguard variable differs between nodes",
    "PROC_INCONSISTENT": "WORLD_SIZE/MASTER_ADDR/MASTER_PORT differ between nodes",
    "DRIFT_PYTHONPATH": "a PYTHONPATH entry is set on some nodes and not others",
    "PYTHONPATH_MISSING_ENTRY": "a PYTHONPATH entry does not exist on the node",
    "DRIFT_GPU_COUNT": "nodes have different GPU counts",
    "STORAGE_MISSING": "the storage path does not exist on the node",
    "STORAGE_LOW_SPACE": "little free space on the storage path",
    "CLOCK_SKEW": "the node's clock differs from the driver's",
    # model.py (at the first report, from rayguard.train)
    "MODEL_BATCHNORM_NOT_SYNCED": "BatchNorm that is not SyncBatchNorm in a multi-rank data-parallel model",
    "MODEL_PARAMS_DIFFER": "replicated parameters differ across ranks at the first report",
    "STATE_FULL_ON_EVERY_RANK": "every rank passed the same large full state dict in state=",
    # runner.py
    "DOCTOR_NO_CLUSTER": "no Ray cluster found: checked this machine only",
    "DOCTOR_PROBE_FAILED": "the probe task failed on a node",
    "DOCTOR_PROBE_TIMEOUT": "the probe task did not return in time on a node",
}
