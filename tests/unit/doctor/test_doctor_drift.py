from __future__ import annotations

from rayguard.doctor.drift import check_drift, clock_skew_s

from .helpers import codes, gpu_probe


def nodes(*envs: dict[str, str], **kw: object) -> list:
    return [gpu_probe(env, node=f"n{i}", **kw) for i, env in enumerate(envs)]


def test_identical_nodes_are_clean():
    assert check_drift(nodes({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "WARN"})) == []


def test_version_drift():
    probes = nodes({}, {}, {})
    probes[1].versions = {**probes[1].versions, "torch": "2.4.0"}
    probes[2].versions = {**probes[2].versions, "python": "3.11.9"}
    found = {f.subject: f for f in check_drift(probes)}
    assert found["torch"].code == "DRIFT_VERSION" and found["torch"].severity == "error"
    assert "2.4.0 on n1" in found["torch"].message
    assert found["python"].severity == "warning"  # patch release only
    probes[2].versions = {**probes[2].versions, "python": "3.10.12"}
    assert {f.subject: f for f in check_drift(probes)}["python"].severity == "error"


def test_env_drift_and_inconsistent_rendezvous():
    found = check_drift(nodes({"NCCL_IB_HCA": "mlx5", "MASTER_PORT": "29500", "HOME": "/a"},
                              {"MASTER_PORT": "29501", "HOME": "/b"}))
    assert sorted((f.code, f.subject) for f in found) == [("DRIFT_ENV", "NCCL_IB_HCA"),
                                                         ("PROC_INCONSISTENT", "MASTER_PORT")]


def test_pythonpath_drift_and_missing_entry():
    probes = nodes({"PYTHONPATH": "/code:/extra"}, {"PYTHONPATH": "/code"})
    probes[0].pythonpath_missing = ["/extra"]
    found = check_drift(probes)
    assert codes(found) == ["DRIFT_PYTHONPATH", "PYTHONPATH_MISSING_ENTRY"]
    assert [f.node for f in found if f.code == "PYTHONPATH_MISSING_ENTRY"] == ["n0"]


def test_storage_missing_and_low():
    probes = nodes({}, {}, storage_path="/ckpt", storage_exists=True, storage_free_bytes=100 * 1024**3)
    probes[1].storage_exists, probes[1].storage_free_bytes = False, None
    assert [(f.code, f.node) for f in check_drift(probes)] == [("STORAGE_MISSING", "n1")]
    probes[1].storage_exists, probes[1].storage_free_bytes = True, 1024**3
    assert [(f.code, f.node) for f in check_drift(probes)] == [("STORAGE_LOW_SPACE", "n1")]


def test_gpu_count_drift():
    probes = nodes({}, {})
    probes[1].gpus = probes[1].gpus[:1]
    assert codes(check_drift(probes)) == ["DRIFT_GPU_COUNT"]


def test_clock_skew():
    assert clock_skew_s(100.0, 99.0, 101.0) == 0.0
    assert clock_skew_s(90.0, 99.0, 101.0) == 9.0
    probes = nodes({}, {})
    probes[0].clock_s, probes[1].clock_s = 100.5, 130.0
    found = check_drift(probes, windows={"n0": (100.0, 101.0), "n1": (100.0, 101.0)})
    assert [(f.code, f.node) for f in found] == [("CLOCK_SKEW", "n1")]
