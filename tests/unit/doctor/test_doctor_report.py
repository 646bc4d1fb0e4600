from __future__ import annotations

import json
import pathlib
import pickle
import re
import time

import pytest

import rayguard.doctor as doctor
from rayguard.doctor import CODES, DoctorReport, Finding, raise_on_errors, worker_preflight
from rayguard.doctor.runner import DoctorUnavailableError, resolve_address, run
from rayguard.exceptions import PreflightError

from .helpers import RAY_TRAIN_WORKER_ENV

DOCTOR_DIR = pathlib.Path(doctor.__file__).parent


def test_every_emitted_code_is_listed_and_every_listed_code_is_emitted():
    source = "".join(p.read_text() for p in DOCTOR_DIR.glob("*.py"))
    emitted = set(re.findall(r'Finding\(\s*"([A-Z_]+)"', source))
    emitted |= set(re.findall(r'"([A-Z][A-Z_]+)" if ', source)) | set(re.findall(r' else "([A-Z][A-Z_]+)"', source))
    assert emitted - set(CODES) == set()
    assert set(CODES) - emitted == set()


def test_report_json_shape_table_and_exit_code():
    findings = [Finding("CVD_DUPLICATE", "error", "CUDA_VISIBLE_DEVICES", "dup", "fix it", "n1"),
                Finding("NCCL_DEBUG_ON", "info", "NCCL_DEBUG", "on", "off", "n0")]
    report = DoctorReport(findings[::-1], [{"node": "n0"}, {"node": "n1"}], "10.0.0.1:6379", 1.25)
    data = json.loads(report.to_json())
    assert set(data) == {"version", "ok", "address", "duration_s", "counts", "nodes", "findings"}
    assert data["ok"] is False and data["counts"] == {"error": 1, "warning": 0, "info": 1}
    assert data["findings"][0] == {"code": "CVD_DUPLICATE", "severity": "error",
                                   "subject": "CUDA_VISIBLE_DEVICES", "message": "dup",
                                   "fix": "fix it", "node": "n1"}
    assert Finding.from_dict(data["findings"][0]) == findings[0]
    assert report.exit_code == 1 and DoctorReport(findings[1:]).exit_code == 0
    table = report.format_table()
    assert "CVD_DUPLICATE" in table and "fix: fix it" in table
    with pytest.raises(ValueError, match="severity"):
        Finding("X", "fatal", "s", "m", "f")  # type: ignore[arg-type]


def test_worker_preflight_clean_for_ray_train_env_and_fast():
    start = time.perf_counter()
    assert [f for f in worker_preflight(RAY_TRAIN_WORKER_ENV) if f.severity == "error"] == []
    elapsed = time.perf_counter() - start
    print(f"worker_preflight took {elapsed * 1000:.1f} ms")


def test_raise_on_errors_names_every_error_and_pickles():
    findings = worker_preflight({**RAY_TRAIN_WORKER_ENV, "NCCL_SOCKET_NTHREADS": "99",
                                 "RANK": "7", "NCCL_DEBUG": "INFO"})
    raise_on_errors([f for f in findings if f.severity != "error"], rank=1, node="n1")  # no error
    with pytest.raises(PreflightError) as info:
        raise_on_errors(findings, rank=1, node="n1")
    text = str(info.value)
    assert "2 error(s) on rank 1, node n1" in text
    assert "NCCL_SOCKET_THREADS_RANGE" in text and "PROC_OUT_OF_RANGE" in text
    assert "Fix: set NCCL_SOCKET_NTHREADS within 1..16" in text
    assert "NCCL_DEBUG_ON" not in text  # info findings do not stop a run
    assert str(pickle.loads(pickle.dumps(info.value))) == text


def test_local_run_without_cluster(no_ray, tmp_path, monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith(("NCCL_", "RAYGUARD_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # "auto" finds a dead cluster
    assert resolve_address("auto") is None
    report = run("auto", storage_path=str(tmp_path / "missing"), env={"NCCL_SOCKET_IFNAME": "nosuch"},
                 min_free_bytes=0)
    assert report.address is None and len(report.nodes) == 1
    assert {"DOCTOR_NO_CLUSTER", "STORAGE_MISSING", "NCCL_IFNAME_NO_MATCH"} <= report.codes()
    assert report.exit_code == 1
    assert run(None, storage_path=str(tmp_path), min_free_bytes=0).codes() == set()


def test_unreachable_explicit_address_cannot_run():
    with pytest.raises(DoctorUnavailableError, match="no Ray cluster answers"):
        resolve_address("127.0.0.1:1")
    assert resolve_address("none") is None


def test_cli_exit_codes_in_process(no_ray, capsys, monkeypatch):
    from rayguard.cli import main

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    for name in [n for n in __import__("os").environ if n.startswith(("NCCL_", "RAYGUARD_"))]:
        monkeypatch.delenv(name)
    assert main(["doctor", "--address", "none", "--env", "CUDA_VISIBLE_DEVICES=0,0"]) == 1
    out = capsys.readouterr().out
    assert "CVD_DUPLICATE" in out and "fix:" in out
    assert main(["doctor", "--address", "none"]) == 0
    assert main(["doctor", "--address", "127.0.0.1:1"]) == 2
    assert "no Ray cluster answers" in capsys.readouterr().err
    assert main(["doctor", "--env", "NOEQUALS"]) == 2
