from __future__ import annotations

import socket

import pytest

from rayguard.doctor.checks import check_node
from rayguard.doctor.probe import probe_local
from rayguard.doctor.process_env import check_process_env

from .helpers import RAY_TRAIN_WORKER_ENV, codes, gpu_probe


def run(env: dict[str, str], **kw: object) -> list[str]:
    return codes(check_process_env(gpu_probe(env, **kw)))


def test_ray_train_worker_env_is_clean_for_every_check():
    assert check_node(gpu_probe(RAY_TRAIN_WORKER_ENV)) == []


def test_no_rendezvous_vars_is_clean():
    assert run({}) == []


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"])
def test_not_int(name):
    assert "PROC_NOT_INT" in run({**RAY_TRAIN_WORKER_ENV, name: "one"})


@pytest.mark.parametrize("override", [
    {"RANK": "4"}, {"RANK": "-1"}, {"LOCAL_RANK": "2"}, {"WORLD_SIZE": "0"},
    {"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "0", "RANK": "0"},
])
def test_out_of_range(override):
    assert "PROC_OUT_OF_RANGE" in run({**RAY_TRAIN_WORKER_ENV, **override})


def test_missing_partner_var():
    env = {k: v for k, v in RAY_TRAIN_WORKER_ENV.items() if k != "MASTER_PORT"}
    found = check_process_env(gpu_probe(env))
    assert [f.subject for f in found if f.code == "PROC_MISSING"] == ["MASTER_PORT"]
    assert run({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}) == []  # launcher-only vars


@pytest.mark.parametrize("port,code", [("http", "MASTER_PORT_INVALID"), ("70000", "MASTER_PORT_INVALID"),
                                       ("0", "MASTER_PORT_INVALID"), ("80", "MASTER_PORT_PRIVILEGED")])
def test_master_port(port, code):
    assert code in run({**RAY_TRAIN_WORKER_ENV, "MASTER_PORT": port})


@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost", "::1"])
def test_loopback_master_in_multi_node_job(addr):
    assert "MASTER_ADDR_LOOPBACK" in run({**RAY_TRAIN_WORKER_ENV, "MASTER_ADDR": addr})
    single_node = {**RAY_TRAIN_WORKER_ENV, "MASTER_ADDR": addr, "LOCAL_WORLD_SIZE": "4"}
    assert run(single_node) == []


def test_network_findings_from_probe_record():
    env = RAY_TRAIN_WORKER_ENV
    assert run(env, master_resolved=[]) == ["MASTER_ADDR_UNRESOLVABLE"]
    assert run(env, master_resolved=["10.0.0.1"], master_connect="timeout") == ["MASTER_UNREACHABLE"]
    assert run(env, master_resolved=["10.0.0.1"], master_connect="refused") == ["MASTER_NOT_LISTENING"]
    assert run(env, master_resolved=["10.0.0.1"], master_connect="ok") == []


def test_real_probe_resolves_and_connects():
    env = {**RAY_TRAIN_WORKER_ENV, "MASTER_ADDR": "no-such-host.invalid"}
    assert "MASTER_ADDR_UNRESOLVABLE" in codes(check_process_env(probe_local(env, deep=False)))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        env = {**RAY_TRAIN_WORKER_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "LOCAL_WORLD_SIZE": "4"}
        assert probe_local(env, deep=False).master_connect == "ok"
    closed = probe_local(env, deep=False)  # the listener is gone now
    assert closed.master_connect == "refused"
    assert codes(check_process_env(closed)) == ["MASTER_NOT_LISTENING"]
    assert probe_local(env, deep=False, network=False).master_connect is None


@pytest.mark.parametrize("value,expected", [("VERBOSE", ["TORCH_DISTRIBUTED_DEBUG_INVALID"]),
                                            ("DETAIL", ["TORCH_DISTRIBUTED_DEBUG_ON"]),
                                            ("info", ["TORCH_DISTRIBUTED_DEBUG_ON"]), ("OFF", [])])
def test_torch_distributed_debug(value, expected):
    assert run({"TORCH_DISTRIBUTED_DEBUG": value}) == expected
