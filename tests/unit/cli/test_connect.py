"""rayguard.connect: the helper-process protocol, its bounds and the auth classification,
with real child processes running small targets (no Ray)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from rayguard.connect import (
    ClusterUnavailableError,
    call_connected,
    is_auth_failure,
    process_elapsed_s,
)
from rayguard.doctor.findings import Finding
from rayguard.doctor.report import DoctorReport

HERE = str(Path(__file__).parent)
BOUND_S = 120.0


@pytest.fixture(autouse=True)
def _targets_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))


def call(target: str, connect_timeout_s: float = BOUND_S, **kwargs):
    return call_connected(f"connect_targets:{target}", kwargs, command="rayguard test",
                          address="fake:0", local_hint="use --address none",
                          connect_timeout_s=connect_timeout_s, timeout_s=BOUND_S)


def test_result_comes_back_despite_stdout_noise():
    assert call("answer", value=[1, "two"]) == {"echo": [1, "two"]}


def test_an_exception_in_the_child_is_a_clear_error():
    with pytest.raises(ClusterUnavailableError, match="ValueError: bad thing") as info:
        call("raise_error")
    assert info.value.kind == "failed" and "use --address none" in str(info.value)


def test_a_dead_child_is_reported_with_its_last_words():
    with pytest.raises(ClusterUnavailableError, match="exit 3.*dying now"):
        call("die")


def test_the_connect_is_bounded():
    with pytest.raises(ClusterUnavailableError, match="could not connect .* within 2 s") as info:
        call("hang_connecting", connect_timeout_s=2)
    assert info.value.kind == "timeout"


def test_an_auth_refusal_ends_the_wait_with_the_fix(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ClusterUnavailableError) as info:
        call("refused")  # the child would sleep 600 s: the refusal ends it
    text = str(info.value)
    assert info.value.kind == "auth" and "fake:3 refused this process's authentication" in text
    assert "RAY_AUTH_MODE=token" in text and "use --address none" in text
    assert "RAY_AUTH_MODE is unset here" in text


def test_auth_markers_and_pickling():
    assert is_auth_failure("gcs_client.cc:210: Failed to get cluster ID from GCS server: "
                           "Unauthenticated: RPC error: InvalidAuthToken: ...")
    assert not is_auth_failure("rpc_client.h:153: Failed to connect to GCS at address "
                               "10.0.0.1:6379 within 5 seconds.")
    err = pickle.loads(pickle.dumps(ClusterUnavailableError("m", "auth")))
    assert (str(err), err.kind) == ("m", "auth")


def test_process_elapsed_counts_from_process_start():
    elapsed = process_elapsed_s()
    assert elapsed is not None and elapsed > 0.0


def test_report_headline_says_where_it_looked():
    local = DoctorReport([Finding("DOCTOR_NO_CLUSTER", "info", "ray", "m", "f")], [{}], None, 2.5)
    assert local.format_table().startswith(
        "rayguard doctor: no Ray cluster found: checked this machine only, 2.5 s")
    assert DoctorReport([], [{}], None, 1.0).headline().endswith("this machine only (--address none), 1.0 s")
    remote = DoctorReport.from_dict(DoctorReport([], [{}, {}], "10.0.0.1:6379", 3.0).to_dict())
    assert remote.headline() == "rayguard doctor: 2 node(s) of the Ray cluster at 10.0.0.1:6379, 3.0 s"


def test_exit_handlers_are_put_back():
    import signal

    from rayguard.cli import main

    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert main(["checkpoint", "ls", "/does/not/exist"]) == 2
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
