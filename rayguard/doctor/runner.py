"""Run the doctor: one probe task pinned to every alive node of a Ray cluster (or the local
machine when no cluster runs), then the per-node and cross-node checks."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import rayguard.doctor.probe as probe_module
from rayguard.doctor.checks import check_node
from rayguard.doctor.drift import DEFAULT_MAX_SKEW_S, DEFAULT_MIN_FREE_BYTES, check_drift
from rayguard.doctor.findings import Finding
from rayguard.doctor.probe import NodeProbe, probe_local
from rayguard.doctor.report import DoctorReport
from rayguard.exceptions import RayGuardError
from rayguard.placement import cpulist, discovery, model

SHIPPED_MODULES: tuple[ModuleType, ...] = (cpulist, model, discovery, probe_module)
"""What the probe task runs, pickled by value: the node then needs no rayguard import (faster
cold start; a node without rayguard still reports, as version drift). All standard library
only: the probe reads the machine through placement's discovery, which builds the plain
records of :mod:`rayguard.placement.model`."""

LOCAL_ONLY = "none"  # address meaning "do not look for a cluster"


class DoctorUnavailableError(RayGuardError):
    """The doctor could not run (e.g. an explicit address that cannot be reached)."""


def _gcs_reachable(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return True  # not host:port (e.g. ray:// client): let ray.init decide
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def resolve_address(address: str | None) -> str | None:
    """The cluster to check, or None for the local machine only.

    ``"auto"``: RAY_ADDRESS / the latest local cluster, else None. ``None``/``"none"``: None.
    Anything else must be reachable, or DoctorUnavailableError."""
    from rayguard._ray.core import resolve_auto_address

    if address in (None, LOCAL_ONLY):
        return None
    if address == "auto":
        try:
            found = resolve_auto_address()
        except ConnectionError:
            return None
        return found if found and _gcs_reachable(found) else None
    if address.startswith("ray://") or _gcs_reachable(address):
        return address
    raise DoctorUnavailableError(f"rayguard doctor: no Ray cluster answers at {address!r}. "
                                 "Fix: pass the head node's GCS address (host:6379), check "
                                 "`ray status` there, or pass --address none to check only this machine")


@contextlib.contextmanager
def shipped_by_value() -> Iterator[None]:
    """While open, cloudpickle sends :data:`SHIPPED_MODULES`' code by value."""
    import ray

    for module in SHIPPED_MODULES:
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in SHIPPED_MODULES:
            ray.cloudpickle.unregister_pickle_by_value(module)


def _summary(p: NodeProbe, ray_node_id: str = "") -> dict[str, Any]:
    return {"node": p.node, "hostname": p.hostname, "ray_node_id": ray_node_id,
            "cpus": p.cpu_count, "gpus": None if p.gpus is None else len(p.gpus),
            "ib_devices": p.ib_devices, "versions": p.versions}


def _probe_cluster(env: Mapping[str, str] | None, storage_path: str | None,
                   connect_timeout_s: float, timeout_s: float
                   ) -> tuple[list[NodeProbe], dict[str, tuple[float, float]], list[Finding], list[str]]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs: dict[Any, str] = {}
    with shipped_by_value():
        task = ray.remote(probe_module.probe_on_node)
        sent = time.time()
        for n in nodes:
            strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ref = task.options(num_cpus=0, scheduling_strategy=strategy, max_retries=0).remote(
                dict(env or {}), storage_path, connect_timeout_s, n["NodeID"])
            refs[ref] = n["NodeID"]
    probes, windows, failures, ids = [], {}, [], []
    pending, deadline = list(refs), time.monotonic() + timeout_s
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            break
        received = time.time()
        for ref in done:
            node_id = refs[ref]
            try:
                probe = _from_dict(ray.get(ref))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - any failure is a finding
                failures.append(Finding("DOCTOR_PROBE_FAILED", "error", "probe",
                                        f"the probe task failed: {type(exc).__name__}: "
                                        f"{str(exc).splitlines()[-1] if str(exc) else ''}",
                                        "check that rayguard is installed on this node and "
                                        "the node is healthy (`ray status`)", node_id[:8]))
                continue
            probes.append(probe)
            ids.append(node_id)
            windows[probe.node] = (sent, received)
    for ref in pending:
        ray.cancel(ref, force=True)
        failures.append(Finding("DOCTOR_PROBE_TIMEOUT", "error", "probe",
                                f"the probe did not answer within {timeout_s:.0f} s",
                                "the node may be overloaded, out of worker processes or "
                                "partitioned; check `ray status` and its raylet logs",
                                refs[ref][:8]))
    return probes, windows, failures, ids


def _from_dict(data: Mapping[str, Any]) -> NodeProbe:
    names = {f.name for f in dataclasses.fields(NodeProbe)}
    return NodeProbe.from_dict({k: v for k, v in data.items() if k in names})


def run(address: str | None = "auto", *, storage_path: str | None = None,
        env: Mapping[str, str] | None = None, timeout_s: float = 60.0,
        connect_timeout_s: float = 1.0, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        max_skew_s: float = DEFAULT_MAX_SKEW_S) -> DoctorReport:
    """Check the distributed-training setup of every alive node and return the findings.

    Args:
        address: Ray cluster to check. ``"auto"``: the running one, else this machine only
            (no Ray is started); ``None``/``"none"``: this machine only; ``host:port``: that
            cluster, or DoctorUnavailableError when it does not answer. When this process is
            already connected to Ray, that cluster is used.
        storage_path: the run's storage path; checked for existence and free space per node.
        env: variables the run will set (e.g. runtime_env env_vars), laid over each node's.
        timeout_s: how long to wait for all probes.
        connect_timeout_s: TCP connect timeout to MASTER_ADDR:MASTER_PORT (0: skip).
        min_free_bytes / max_skew_s: thresholds of STORAGE_LOW_SPACE / CLOCK_SKEW.
    """
    import ray

    start = time.monotonic()
    connected_here = False
    findings: list[Finding] = []
    if ray.is_initialized():
        target: str | None = ray.get_runtime_context().gcs_address
        wanted = resolve_address(address) if address not in (None, "auto", "none") else None
        if wanted is not None and wanted.rsplit(":", 1)[-1] != str(target).rsplit(":", 1)[-1]:
            raise DoctorUnavailableError(
                f"rayguard doctor: this process is already connected to the Ray cluster at "
                f"{target}, so it cannot check {wanted!r}. Fix: run `rayguard doctor --address "
                f"{wanted}` in a fresh process, or call rayguard.doctor.run() before ray.init()")
    else:
        target = resolve_address(address)
        if target is not None:
            try:
                ray.init(address=target, logging_level=logging.ERROR, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001
                raise DoctorUnavailableError(f"rayguard doctor: could not connect to {target!r}: "
                                             f"{exc}. Fix: check the address and `ray status`") from exc
            connected_here = True
    try:
        if target is None:
            if address == "auto":
                findings.append(Finding("DOCTOR_NO_CLUSTER", "info", "ray",
                                        "no Ray cluster found: checked this machine only",
                                        "start the cluster (or pass --address) to check every node"))
            merged = {**os.environ, **(env or {})}
            probes = [probe_local(merged, storage_path=storage_path,
                                  connect_timeout_s=connect_timeout_s)]
            windows: dict[str, tuple[float, float]] = {}
            ids = [""]
        else:
            probes, windows, failed, ids = _probe_cluster(env, storage_path, connect_timeout_s, timeout_s)
            findings += failed
        for p in probes:
            findings += check_node(p, num_nodes=len(probes))
        findings += check_drift(probes, windows=windows, min_free_bytes=min_free_bytes,
                                max_skew_s=max_skew_s)
    finally:
        if connected_here:
            ray.shutdown()
    return DoctorReport(findings, [_summary(p, i) for p, i in zip(probes, ids, strict=True)], target,
                        time.monotonic() - start)
