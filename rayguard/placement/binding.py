"""Worker-side NUMA binding: apply a :class:`~rayguard.placement.numa.WorkerPlan` to this
process. Runs inside each training worker, before the user's function.

What is bound:

* CPU affinity of every thread of the process (``/proc/self/task``), so threads Ray or torch
  already started follow too; threads and processes started later inherit it.
* ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` and ``torch.set_num_threads`` sized to the set.
* Memory policy "preferred: local node" for the calling thread and the threads it starts,
  through libnuma's ``numa_set_preferred`` when ``libnuma.so`` loads, else the
  ``set_mempolicy`` system call. Skipped (with a note) when the node does not exist on this
  machine (a simulated topology) or the platform refuses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rayguard.exceptions import ConfigError, WorkerSetupError
from rayguard.placement.discovery import SYS_NODE_DIR
from rayguard.placement.numa import NodePlan, WorkerPlan, WorkerRequest, plan_node
from rayguard.placement.topology import discover_topology

logger = logging.getLogger("rayguard.placement")

MODES = ("auto", "strict", "off")
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_MPOL_PREFERRED = 1
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}


@dataclass(frozen=True)
class BindingResult:
    """What binding did in this worker (exposed as ``ctx.numa_node`` / ``ctx.cpu_affinity``)."""

    mode: str
    """``auto``, ``strict`` or ``off``."""
    local_rank: int | None
    numa_node: int | None
    """NUMA node the worker is bound to; None when nothing was bound."""
    cpu_affinity: list[int]
    """The process's CPU affinity after binding, read back from the kernel, sorted."""
    threads: int
    """Intra-op threads set (torch and OMP/MKL); the current torch value when unbound."""
    memory_policy: str
    """What was done about memory placement, in words."""
    bound: bool
    """True when the CPU affinity was set to the plan."""
    notes: tuple[str, ...] = ()
    source: str = ""
    """Where the topology came from (``override:<path>``, ``nvml``, ``sysfs``, ``none``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        if not self.bound:
            return f"NUMA binding off or skipped (mode={self.mode}): " + "; ".join(self.notes)
        return (f"local_rank={self.local_rank} bound to NUMA node {self.numa_node}, "
                f"cpus={self.cpu_affinity}, threads={self.threads}; {self.memory_policy}")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"GuardConfig(numa={mode!r}): must be \"auto\", \"strict\" or \"off\". "
                          'Fix: pass numa="auto"')


def current_affinity() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _torch_threads(threads: int | None) -> int:
    """Set torch's intra-op threads when torch is loaded (else ``OMP_NUM_THREADS`` sizes it
    at import); return the count in force."""
    torch = sys.modules.get("torch")
    if torch is None:
        return threads or int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    if threads:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def set_process_affinity(cpus: Sequence[int]) -> list[int]:
    """Set the affinity of every thread of this process; return the calling thread's."""
    wanted = set(cpus)
    os.sched_setaffinity(0, wanted)  # the caller first: its errors are the ones that matter
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, wanted)
        except OSError:
            pass  # a thread that exited meanwhile
    return current_affinity()


def set_preferred_memory_node(node: int, node_dir: Path = SYS_NODE_DIR) -> tuple[bool, str]:
    """Prefer ``node`` for this thread's new allocations. Returns (done, what happened)."""
    if not (node_dir / f"node{node}").is_dir():
        return False, (f"memory policy not set: NUMA node {node} does not exist on this machine "
                       "(simulated topology?)")
    lib_name = ctypes.util.find_library("numa")
    if lib_name:
        try:
            libnuma = ctypes.CDLL(lib_name, use_errno=True)
            if libnuma.numa_available() >= 0:
                libnuma.numa_set_preferred(ctypes.c_int(node))
                return True, f"memory policy: prefer node {node} (libnuma numa_set_preferred)"
        except (OSError, AttributeError):
            pass
    nr = _SYS_SET_MEMPOLICY.get(platform.machine())
    if nr is None:
        return False, f"memory policy not set: no set_mempolicy number for {platform.machine()}"
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_int(_MPOL_PREFERRED), mask,
                      ctypes.c_ulong(words * 64 + 1))
    if rc != 0:
        err = ctypes.get_errno()
        return False, f"memory policy not set: set_mempolicy failed ({os.strerror(err)})"
    return True, f"memory policy: prefer node {node} (set_mempolicy syscall)"


def _unbound(mode: str, local_rank: int | None, notes: Sequence[str],
             source: str = "") -> BindingResult:
    return BindingResult(mode, local_rank, None, current_affinity(), _torch_threads(None),
                         "not set", False, tuple(notes), source)


def _problem(plan: WorkerPlan) -> str | None:
    """Why this plan cannot be bound as asked (strict fails on it), or None."""
    if not plan.cpus:
        return "the plan gives this worker no CPUs (the topology lists none)"
    if plan.gpu_ids and plan.gpu_numa_node is None:
        return (f"the NUMA node of GPU(s) {list(plan.gpu_ids)} is unknown on this multi-node "
                "machine: " + "; ".join(plan.notes))
    return None


def _strict_error(plan: WorkerPlan | None, local_rank: int | None, why: str) -> WorkerSetupError:
    return WorkerSetupError(
        f"NUMA binding (numa=\"strict\") failed on {socket.gethostname()} "
        f"local_rank={local_rank if plan is None else plan.local_rank}: {why}. Fix: check the "
        "topology with `rayguard topology` (or RAYGUARD_TOPOLOGY), or pass "
        'GuardConfig(numa="auto") to bind where possible and go on')


def bind_worker(mode: str, plan_entry: WorkerPlan | None, *, source: str = "") -> BindingResult:
    """Bind this process to ``plan_entry``. ``off`` touches nothing; ``strict`` raises
    :class:`WorkerSetupError` when binding is impossible; ``auto`` binds what it can."""
    _check_mode(mode)
    rank = plan_entry.local_rank if plan_entry else None
    if mode == "off" or plan_entry is None:
        return _unbound(mode, rank, ["numa=off: nothing bound"] if mode == "off"
                        else ["no plan for this worker"], source)
    notes = list(plan_entry.notes)
    problem = _problem(plan_entry)
    if problem and (mode == "strict" or not plan_entry.cpus):
        if mode == "strict":
            raise _strict_error(plan_entry, rank, problem)
        return _unbound(mode, rank, [*notes, problem], source)
    if problem:
        notes.append(problem)
    before = current_affinity()
    try:
        affinity = set_process_affinity(plan_entry.cpus)
    except OSError as exc:
        why = f"sched_setaffinity({list(plan_entry.cpus)}) failed: {exc.strerror or exc}"
        if mode == "strict":
            raise _strict_error(plan_entry, rank, why) from None
        return _unbound(mode, rank, [*notes, why + " (CPU ids not on this machine?)"], source)
    if affinity != sorted(plan_entry.cpus):
        why = f"the kernel allowed only CPUs {affinity} of the planned {list(plan_entry.cpus)}"
        if mode == "strict":
            set_process_affinity(before)  # leave the process as it was found
            raise _strict_error(plan_entry, rank, why)
        notes.append(why)
    threads = max(1, len(affinity))
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(threads)
    threads = _torch_threads(threads)
    node = plan_entry.numa_node
    mem = set_preferred_memory_node(node)[1] if node is not None else "memory policy not set"
    result = BindingResult(mode, rank, node, affinity, threads, mem, True, tuple(notes), source)
    logger.debug("rayguard NUMA: %s%s", result.summary(),
                f" (notes: {'; '.join(notes)})" if notes else "")
    return result


def setup_numa(mode: str, local_rank: int, local_peers: list[dict]) -> BindingResult:
    """Discover this node's topology, plan every worker on it and bind this one.

    ``local_peers``: one ``{"local_rank", "gpu_ids", "num_cpus"}`` dict per worker on this
    node, this worker included (``gpu_ids`` as ``ray.get_gpu_ids()`` gives them).
    """
    _check_mode(mode)
    if mode == "off":
        return bind_worker("off", None)
    try:
        requests = [WorkerRequest.from_dict(p) for p in local_peers]
        if local_rank not in {r.local_rank for r in requests}:
            raise ConfigError(f"setup_numa(local_rank={local_rank}): not among the peers' local "
                              f"ranks {sorted(r.local_rank for r in requests)}. Fix: include "
                              "this worker in local_peers")
        topology = discover_topology()
        plan: NodePlan = plan_node(topology, requests)
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        if mode == "strict":
            raise _strict_error(None, local_rank, str(exc)) from None
        logger.warning("rayguard NUMA: not binding local_rank=%s: %s", local_rank, exc)
        return _unbound(mode, local_rank, [str(exc)])
    entry = plan.for_rank(local_rank)
    result = bind_worker(mode, entry, source=topology.source)
    if plan.notes:
        result = BindingResult(**{**result.to_dict(), "notes": (*result.notes, *plan.notes)})
    return result
