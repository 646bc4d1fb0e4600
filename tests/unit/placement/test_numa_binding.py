"""Worker-side binding. Anything that really binds runs in a forked child, so the test
process keeps its affinity; failures that must leave the process alone run in-process."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.exceptions import ConfigError, WorkerSetupError
from rayguard.placement import binding
from rayguard.placement.binding import bind_worker, set_preferred_memory_node, setup_numa
from rayguard.placement.numa import WorkerPlan

HERE_CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(HERE_CPUS) < 2, reason="needs 2 usable CPUs")


def write_topology(tmp_path: Path, node_cpus: list[list[int]], gpu_nodes: list[int]) -> Path:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({
        "numa_nodes": [{"id": i, "cpus": c} for i, c in enumerate(node_cpus)],
        "gpus": [{"index": i, "numa_node": n} for i, n in enumerate(gpu_nodes)],
    }))
    return path


def peers(*gpus: str) -> list[dict]:
    return [{"local_rank": r, "gpu_ids": [g] if g else [], "num_cpus": 1}
            for r, g in enumerate(gpus)]


def _child(conn: Any, fn: Callable[[], dict]) -> None:
    try:
        conn.send(("ok", fn()))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        conn.send(("error", exc))
    finally:
        conn.close()
        os._exit(0)


def in_child(fn: Callable[[], dict]) -> tuple[str, Any]:
    """Run ``fn`` in a forked child (its binding dies with it) and return what it sent."""
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_child, args=(child, fn))
    proc.start()
    assert parent.poll(60), "child did not answer"
    out = parent.recv()
    proc.join(10)
    return out


@needs_two_cpus
def test_auto_binds_every_thread_to_the_gpus_node(tmp_path: Path, monkeypatch) -> None:
    # node 0 = first CPU, node 1 = second; GPU 0 sits on node 1, GPU 1 on node 0.
    cpu_a, cpu_b = HERE_CPUS[:2]
    monkeypatch.setenv(TOPOLOGY_ENV_VAR, str(write_topology(tmp_path, [[cpu_a], [cpu_b]], [1, 0])))

    def work() -> dict:
        started = threading.Event()
        stop = threading.Event()
        seen: dict[str, Any] = {}

        def older_thread() -> None:  # started before binding: must be bound too
            started.set()
            stop.wait()
            seen["older"] = sorted(os.sched_getaffinity(0))

        t = threading.Thread(target=older_thread)
        t.start()
        started.wait()
        result = setup_numa("auto", 0, peers("0", "1"))
        stop.set()
        t.join()
        return {"result": result.to_dict(), "main": sorted(os.sched_getaffinity(0)),
                "older": seen["older"], "omp": os.environ["OMP_NUM_THREADS"],
                "mkl": os.environ["MKL_NUM_THREADS"]}

    status, out = in_child(work)
    assert status == "ok", out
    res = out["result"]
    assert res["bound"] and res["numa_node"] == 1 and res["cpu_affinity"] == [cpu_b]
    assert out["main"] == out["older"] == [cpu_b]
    assert res["threads"] == 1 and out["omp"] == out["mkl"] == "1"
    assert res["source"].startswith("override:")
    if not Path("/sys/devices/system/node/node1").is_dir():
        assert "does not exist on this machine" in res["memory_policy"]


@needs_two_cpus
def test_strict_with_cpus_the_machine_lacks_fails_and_leaves_affinity(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(TOPOLOGY_ENV_VAR, str(write_topology(tmp_path, [[HERE_CPUS[0], 4000]], [0])))

    def work() -> dict:
        before = sorted(os.sched_getaffinity(0))
        try:
            setup_numa("strict", 0, peers("0"))
        except WorkerSetupError as exc:
            return {"error": str(exc), "same": sorted(os.sched_getaffinity(0)) == before}
        return {"error": None}

    status, out = in_child(work)
    assert status == "ok", out
    assert out["error"] and "local_rank=0" in out["error"] and "Fix:" in out["error"]
    assert "4000" in out["error"] and out["same"]
    # auto binds what the kernel allows and says so
    status, out = in_child(lambda: setup_numa("auto", 0, peers("0")).to_dict())
    assert status == "ok" and out["cpu_affinity"] == [HERE_CPUS[0]]
    assert any("kernel allowed only" in n for n in out["notes"])


def test_off_touches_nothing() -> None:
    before = sorted(os.sched_getaffinity(0))
    res = setup_numa("off", 0, peers("0"))
    assert not res.bound and res.numa_node is None and res.cpu_affinity == before
    assert "numa=off" in res.notes[0]


def test_strict_refuses_a_gpu_of_unknown_numa_node(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(TOPOLOGY_ENV_VAR, str(write_topology(tmp_path, [[0], [1]], [-1])))
    before = sorted(os.sched_getaffinity(0))
    with pytest.raises(WorkerSetupError, match=r"local_rank=0.*NUMA node of GPU\(s\) \['0'\]"):
        setup_numa("strict", 0, peers("0"))
    assert sorted(os.sched_getaffinity(0)) == before


def test_bad_topology_file_auto_skips_strict_fails(tmp_path: Path, monkeypatch) -> None:
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"numa_nodes": [{"id": 0, "cpus": "x"}]}))
    monkeypatch.setenv(TOPOLOGY_ENV_VAR, str(bad))
    res = setup_numa("auto", 0, peers("0"))
    assert not res.bound and "numa_nodes[0].cpus" in res.notes[0]
    with pytest.raises(WorkerSetupError, match=r"numa_nodes\[0\]\.cpus"):
        setup_numa("strict", 0, peers("0"))


def test_rank_missing_from_peers_and_bad_mode() -> None:
    assert not setup_numa("auto", 3, peers("0")).bound
    with pytest.raises(WorkerSetupError, match="local_rank=3"):
        setup_numa("strict", 3, peers("0"))
    with pytest.raises(ConfigError, match="numa='fast'"):
        setup_numa("fast", 0, peers("0"))


def test_strict_plan_without_cpus() -> None:
    with pytest.raises(WorkerSetupError, match="no CPUs"):
        bind_worker("strict", WorkerPlan(0, None, (), 1))
    assert not bind_worker("auto", WorkerPlan(0, None, (), 1)).bound


def test_worker_setup_error_pickles() -> None:
    try:
        bind_worker("strict", WorkerPlan(2, None, (), 1))
    except WorkerSetupError as exc:
        again = pickle.loads(pickle.dumps(exc))
        assert str(again) == str(exc) and "local_rank=2" in str(again)


def _policy_in_thread(node: int) -> tuple[tuple[bool, str], str]:
    out: list[Any] = []

    def run() -> None:
        done = set_preferred_memory_node(node)
        maps = Path(f"/proc/self/task/{threading.get_native_id()}/numa_maps")
        out.append((done, maps.read_text() if maps.exists() else ""))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


@pytest.mark.skipif(not Path("/sys/devices/system/node/node0").is_dir(), reason="no NUMA sysfs")
@pytest.mark.parametrize("via", ["libnuma", "syscall"])
def test_memory_policy_prefers_the_node(via: str, monkeypatch) -> None:
    if via == "syscall":
        monkeypatch.setattr(binding.ctypes.util, "find_library", lambda name: None)
    elif not binding.ctypes.util.find_library("numa"):
        pytest.skip("libnuma.so not installed")
    (done, what), maps = _policy_in_thread(0)
    assert done and via in what.replace("numa_set_preferred", "libnuma"), what
    if maps:
        assert "prefer:0" in maps
    (done, what), _ = _policy_in_thread(4095)
    assert not done and "does not exist" in what


def test_strict_accepts_logical_gpus_on_a_single_node_machine(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.setenv(TOPOLOGY_ENV_VAR, str(write_topology(tmp_path, [[HERE_CPUS[0]]], [])))
    status, out = in_child(lambda: setup_numa("strict", 0, peers("0")).to_dict())
    assert status == "ok", out
    assert out["bound"] and out["numa_node"] == 0 and out["cpu_affinity"] == [HERE_CPUS[0]]
