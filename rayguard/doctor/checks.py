"""The per-node check list and the per-worker subset that RobustTrainer runs at start-up."""

from __future__ import annotations

import os
from collections.abc import Mapping

from rayguard.doctor.cuda import check_cuda, check_visible_devices
from rayguard.doctor.findings import Finding, errors
from rayguard.doctor.nccl import check_nccl
from rayguard.doctor.probe import NodeProbe, probe_local
from rayguard.doctor.process_env import check_process_env
from rayguard.doctor.rayguard_env import check_rayguard_env
from rayguard.doctor.threads import check_threads
from rayguard.exceptions import PreflightError


def check_node(probe: NodeProbe, *, num_nodes: int | None = None,
               local_world_size: int | None = None) -> list[Finding]:
    """Every per-node check, each finding attributed to ``probe.node``."""
    found = (check_process_env(probe) + check_cuda(probe)
             + check_nccl(probe, num_nodes=num_nodes)
             + check_threads(probe, local_world_size=local_world_size)
             + check_rayguard_env(probe))
    return [f if f.node else f.on(probe.node) for f in found]


def check_worker(probe: NodeProbe, *, local_world_size: int | None = None) -> list[Finding]:
    """The per-process subset (no versions, no GPU stack, no cross-node view)."""
    found = (check_process_env(probe) + check_visible_devices(probe) + check_nccl(probe)
             + check_threads(probe, local_world_size=local_world_size)
             + check_rayguard_env(probe))
    return [f if f.node else f.on(probe.node) for f in found]


def worker_preflight(env: Mapping[str, str] | None = None, *,
                     local_world_size: int | None = None) -> list[Finding]:
    """Check the current process's environment in a few milliseconds: rendezvous variables,
    CUDA_VISIBLE_DEVICES, NCCL_*, thread counts and RAYGUARD_* names.

    No DNS lookup, TCP connect, nvidia-smi or torch import. ``env`` defaults to
    ``os.environ``; ``local_world_size`` defaults to ``LOCAL_WORLD_SIZE``.
    """
    probe = probe_local(os.environ if env is None else env, deep=False, network=False)
    return check_worker(probe, local_world_size=local_world_size)


def format_finding(f: Finding) -> str:
    where = f" on {f.node}" if f.node else ""
    return f"[{f.code}] {f.severity}{where}: {f.subject}: {f.message}. Fix: {f.fix}"


def raise_on_errors(findings: list[Finding], *, rank: int | None = None,
                    node: str | None = None) -> None:
    """Raise PreflightError naming every ``error`` finding (message and fix); else return."""
    bad = errors(findings)
    if not bad:
        return
    where = ", ".join(p for p in (f"rank {rank}" if rank is not None else "",
                                  f"node {node}" if node else "") if p)
    lines = "\n".join("  " + format_finding(f) for f in bad)
    raise PreflightError(f"rayguard preflight found {len(bad)} error(s)"
                         f"{' on ' + where if where else ''} before training started:\n{lines}\n"
                         "(set GuardConfig(preflight=False) to skip these checks)")
