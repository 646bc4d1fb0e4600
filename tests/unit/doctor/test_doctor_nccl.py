from __future__ import annotations

import pytest

from rayguard.doctor.nccl import check_nccl, match_filter

from .helpers import codes, gpu_probe

IFACES = ["docker0", "eth0", "eth1", "ib0", "lo"]


def nccl(env: dict[str, str], **kw: object) -> list[str]:
    num_nodes = kw.pop("num_nodes", None)
    return codes(check_nccl(gpu_probe(env, **kw), num_nodes=num_nodes))  # type: ignore[arg-type]


@pytest.mark.parametrize("spec,expected", [
    ("eth", ["eth0", "eth1"]), ("=eth", []), ("=eth1", ["eth1"]), ("eth0,ib", ["eth0", "ib0"]),
    ("^docker,lo", ["eth0", "eth1", "ib0"]), ("^=eth", IFACES), ("^=eth0", ["docker0", "eth1", "ib0", "lo"]),
    ("mlx5_0:1", []), ("ib0:1", ["ib0"]),
])
def test_match_filter(spec, expected):
    assert match_filter(spec, IFACES) == expected


def test_clean_env():
    assert nccl({"NCCL_SOCKET_IFNAME": "eth", "NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1"}) == []


@pytest.mark.parametrize("env", [{"NCCL_SOCKET_IFNAME": "ens"}, {"NCCL_SOCKET_IFNAME": "=eth"},
                                 {"NCCL_SOCKET_IFNAME": "^eth,ib,lo"}, {"GLOO_SOCKET_IFNAME": "eth"}])
def test_ifname_matches_nothing(env):
    assert nccl(env) == ["NCCL_IFNAME_NO_MATCH"]


def test_ifname_only_loopback():
    assert nccl({"NCCL_SOCKET_IFNAME": "lo"}) == ["NCCL_IFNAME_LOOPBACK_ONLY"]
    assert nccl({"GLOO_SOCKET_IFNAME": "eth0"}) == []


def test_ib_disable_against_devices():
    assert nccl({"NCCL_IB_DISABLE": "0"}) == ["NCCL_IB_NO_DEVICES"]
    assert nccl({"NCCL_IB_DISABLE": "0"}, ib_devices=["mlx5_0"]) == []
    assert nccl({"NCCL_IB_DISABLE": "1"}, ib_devices=["mlx5_0"]) == ["NCCL_IB_DISABLED_WITH_IB"]
    assert nccl({"NCCL_IB_DISABLE": "yes"}) == ["NCCL_BAD_VALUE"]


def test_ib_hca():
    ib = ["mlx5_0", "mlx5_1"]
    assert nccl({"NCCL_IB_HCA": "mlx4"}, ib_devices=ib) == ["NCCL_IB_HCA_NO_MATCH"]
    assert nccl({"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}, ib_devices=ib) == []


@pytest.mark.parametrize("env,expected", [
    ({"NCCL_SOCKET_NTHREADS": "99"}, ["NCCL_SOCKET_THREADS_RANGE"]),
    ({"NCCL_SOCKET_NTHREADS": "0"}, ["NCCL_SOCKET_THREADS_RANGE"]),
    ({"NCCL_NSOCKS_PERTHREAD": "65"}, ["NCCL_SOCKET_THREADS_RANGE"]),
    ({"NCCL_SOCKET_NTHREADS": "four"}, ["NCCL_BAD_VALUE"]),
    ({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"}, ["NCCL_SOCKET_THREADS_PRODUCT"]),
    ({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "8"}, []),
])
def test_socket_thread_limits(env, expected):
    assert nccl(env) == expected


def test_socket_threads_with_ib():
    env = {"NCCL_SOCKET_NTHREADS": "4"}
    assert nccl(env, ib_devices=["mlx5_0"]) == ["NCCL_SOCKET_THREADS_WITH_IB"]
    assert nccl({**env, "NCCL_IB_DISABLE": "1"}, ib_devices=["mlx5_0"]) == ["NCCL_IB_DISABLED_WITH_IB"]


def test_deprecated_and_misspelled_names():
    found = check_nccl(gpu_probe({"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_SOCKET_IFNAM": "eth0",
                                  "TORCH_NCCL_BLOCKING_WAITT": "1", "NCCL_IB_HCA": "mlx5"}))
    by_subject = {f.subject: f for f in found}
    assert by_subject["NCCL_ASYNC_ERROR_HANDLING"].code == "NCCL_DEPRECATED_VAR"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in by_subject["NCCL_ASYNC_ERROR_HANDLING"].fix
    assert by_subject["NCCL_SOCKET_IFNAM"].code == "NCCL_UNKNOWN_VAR"
    assert "NCCL_SOCKET_IFNAME" in by_subject["NCCL_SOCKET_IFNAM"].fix
    assert "TORCH_NCCL_BLOCKING_WAIT" in by_subject["TORCH_NCCL_BLOCKING_WAITT"].fix
    assert "NCCL_IB_HCA" not in by_subject  # known name (no IB devices here: nothing to match)


def test_timeouts_scale_with_cluster_size():
    assert nccl({"NCCL_IB_TIMEOUT": "10"}) == ["NCCL_TIMEOUT_SMALL"]
    assert nccl({"NCCL_IB_TIMEOUT": "16"}) == []
    assert nccl({"NCCL_IB_TIMEOUT": "16"}, num_nodes=64) == ["NCCL_TIMEOUT_SMALL"]
    assert nccl({"NCCL_IB_TIMEOUT": "28"}) == ["NCCL_TIMEOUT_LARGE"]
    assert nccl({"NCCL_IB_TIMEOUT": "40"}) == ["NCCL_BAD_VALUE"]
    assert nccl({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "10"}) == ["NCCL_TIMEOUT_SMALL"]
    assert nccl({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "86400"}) == ["NCCL_TIMEOUT_LARGE"]
    assert nccl({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}) == []


def test_debug_levels():
    assert nccl({"NCCL_DEBUG": "INFO"}) == ["NCCL_DEBUG_ON"]
    found = check_nccl(gpu_probe({"NCCL_DEBUG": "trace"}))
    assert [(f.code, f.severity) for f in found] == [("NCCL_DEBUG_ON", "warning")]
    assert nccl({"NCCL_DEBUG": "LOUD"}) == ["NCCL_BAD_VALUE"]


def test_error_handling_off():
    assert nccl({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}) == ["NCCL_NO_ERROR_HANDLING"]
    assert nccl({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"}) == []
