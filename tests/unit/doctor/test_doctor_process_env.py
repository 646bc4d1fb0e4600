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


# Rendezvous modes of Ray Train's TorchConfig (ray/train/torch/config.py): "env" sets
# MASTER_ADDR/MASTER_PORT plus RANK/WORLD_SIZE; "tcp" puts the address in the tcp:// URL and
# sets RANK/WORLD_SIZE only.
TCP_WORKER_ENV = {k: v for k, v in RAY_TRAIN_WORKER_ENV.items() if not k.startswith("MASTER_")}


def test_tcp_rendezvous_env_is_not_an_error():
    found = check_node(gpu_probe(TCP_WORKER_ENV))
    assert [(f.code, f.severity) for f in found] == [("PROC_NO_MASTER", "info")]
    assert "tcp://" in found[0].message and "env://" in found[0].message


def test_half_env_rendezvous_is_still_an_error():
    env = {**TCP_WORKER_ENV, "MASTER_ADDR": "10.0.0.1"}
    found = check_process_env(gpu_probe(env))
    assert [(f.code, f.subject, f.severity) for f in found] == [("PROC_MISSING", "MASTER_PORT", "error")]
    no_rank = {k: v for k, v in RAY_TRAIN_WORKER_ENV.items() if k != "RANK"}
    assert [f.subject for f in check_process_env(gpu_probe(no_rank)) if f.code == "PROC_MISSING"] == ["RANK"]


@pytest.mark.parametrize("env", [TCP_WORKER_ENV, {**TCP_WORKER_ENV, "MASTER_ADDR": "10.0.0.1"}])
def test_an_initialized_process_group_means_the_rendezvous_is_done(env):
    assert run(env, process_group=True) == []
    assert "PROC_MISSING" in run({**env, "MASTER_ADDR": "10.0.0.1"}, process_group=False)


def test_worker_preflight_sees_a_real_process_group(tmp_path):
    import torch.distributed as dist

    from rayguard.doctor import worker_preflight

    env = {**TCP_WORKER_ENV, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1"}  # half env://, tcp:// in use
    assert "PROC_MISSING" in codes(worker_preflight(env))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        assert "PROC_MISSING" not in codes(worker_preflight(env))
    finally:
        dist.destroy_process_group()
