"""rayguard doctor on a 4-node cluster simulated on this machine: raylets started with
different environments (Cluster.add_node(env_vars=...)), probed through the Python API and
the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import rayguard.doctor as doctor

pytestmark = pytest.mark.slow
# The tests on the module's multi-node cluster (the shared one shut down) are marked
# own_cluster: they run after the shared cluster's tests (tests/conftest.py).

BAD_IFNAME_NODE = {"NCCL_SOCKET_IFNAME": "nosuch0", "PYTHONPATH": "/nonexistent/rayguard-extra"}
DEBUG_NODE = {"NCCL_DEBUG": "INFO", "RAYGUARD_FAULT": "kill:rank=0,step=1"}


def _clean_env() -> dict[str, str]:
    drop = ("NCCL_", "TORCH_NCCL_", "RAYGUARD_", "RAY_ADDRESS", "MASTER_", "CUDA_VISIBLE")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the shared local cluster; the next ray_local test restarts it
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "env_vars": {}})
    try:
        c.add_node(num_cpus=1, env_vars=BAD_IFNAME_NODE)
        c.add_node(num_cpus=1, env_vars=DEBUG_NODE)
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _by_code(report: doctor.DoctorReport) -> dict[str, list[doctor.Finding]]:
    out: dict[str, list[doctor.Finding]] = {}
    for f in report.findings:
        out.setdefault(f.code, []).append(f)
    return out


@pytest.mark.own_cluster
def test_four_nodes_per_node_and_cross_node_findings(cluster, tmp_path):
    import ray

    ray.init(address=cluster.address)
    try:
        start = time.monotonic()
        # The run's env (runtime_env env_vars) is laid over every node's; the open
        # connection is used and left open.
        report = doctor.run(storage_path=str(tmp_path), env={"NCCL_SOCKET_NTHREADS": "99"},
                            min_free_bytes=0)
        print(f"\ndoctor on 4 simulated nodes, connected driver: {time.monotonic() - start:.2f} s")
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    assert len(report.nodes) == 4 and report.address == cluster.address
    found = _by_code(report)
    ifname = found["NCCL_IFNAME_NO_MATCH"]
    assert len(ifname) == 1 and "nosuch0" in ifname[0].message  # only the node that has it
    bad_node = ifname[0].node
    assert {f.node for f in found["PYTHONPATH_MISSING_ENTRY"]} == {bad_node}
    assert [f.subject for f in found["DRIFT_PYTHONPATH"]] == ["PYTHONPATH"]
    drift_subjects = {f.subject for f in found["DRIFT_ENV"]}
    assert {"NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "RAYGUARD_FAULT"} <= drift_subjects
    assert "NCCL_SOCKET_NTHREADS" not in drift_subjects  # the run's env is the same everywhere
    debug_node = found["NCCL_DEBUG_ON"][0].node
    assert debug_node != bad_node and len(found["NCCL_DEBUG_ON"]) == 1
    assert [f.node for f in found["RAYGUARD_UNKNOWN_VAR"]] == [debug_node]
    ranged = found["NCCL_SOCKET_THREADS_RANGE"]
    assert len({f.node for f in ranged}) == 4
    assert "DRIFT_VERSION" not in found and "CLOCK_SKEW" not in found  # same machine
    assert report.exit_code == 1


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rayguard", "doctor", *args], env=env or _clean_env(),
                          capture_output=True, text=True, timeout=240)


@pytest.mark.own_cluster
def test_cli_json_against_the_cluster(cluster):
    start = time.monotonic()
    proc = _cli("--json", "--address", cluster.address)
    print(f"\n`python -m rayguard doctor --json` on 4 simulated nodes: {time.monotonic() - start:.2f} s")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["address"] == cluster.address and len(data["nodes"]) == 4
    assert set(data["findings"][0]) == {"code", "severity", "node", "subject", "message", "fix"}
    assert data["findings"][0]["severity"] == "error"  # errors first
    assert data["counts"]["error"] == sum(f["severity"] == "error" for f in data["findings"])


def test_cli_without_cluster(tmp_path):
    env = {**_clean_env(), "RAY_ADDRESS": "127.0.0.1:1"}  # "auto" finds nothing alive
    clean = _cli("--json", "--storage-path", str(tmp_path), env=env)
    data = json.loads(clean.stdout)
    assert clean.returncode == 0, clean.stdout
    assert data["address"] is None and [f["code"] for f in data["findings"]] == ["DOCTOR_NO_CLUSTER"]


def test_explicit_unreachable_address_while_connected_is_an_error(ray_local):
    from rayguard.doctor import DoctorUnavailableError
    from rayguard.doctor import run as doctor_run

    with pytest.raises(DoctorUnavailableError, match="no Ray cluster answers"):
        doctor_run(address="127.0.0.1:1")
