"""Topology: the JSON override (schema, errors naming the field) and sysfs discovery over
real files laid out like /sys and /proc."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.exceptions import ConfigError
from rayguard.placement.cpulist import format_cpulist, parse_cpulist
from rayguard.placement.discovery import discover_gpus_sysfs, discover_numa_nodes
from rayguard.placement.model import UNKNOWN_NUMA, normalize_bus_id
from rayguard.placement.schema import TopologyError, load_topology_file, topology_from_dict
from rayguard.placement.topology import discover_topology

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "topology_2socket.json"


def two_nodes(**gpu_overrides: object) -> dict:
    gpu = {"index": 0, "numa_node": 1, **gpu_overrides}
    return {"numa_nodes": [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": [4, 5, 6, 7]}],
            "gpus": [gpu]}


def test_cpulist_parse_and_format() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_cpulist("5-2")


@given(st.sets(st.integers(0, 300), max_size=60))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(sorted(cpus))) == sorted(cpus)


def test_example_file_loads_and_round_trips() -> None:
    topo = load_topology_file(EXAMPLE)
    assert topo.source == f"override:{EXAMPLE}"
    assert [n.id for n in topo.numa_nodes] == [0, 1]
    assert len(topo.node(0).cpus) == 32 and topo.distance(0, 1) == 21
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    again = topology_from_dict(json.loads(json.dumps(topo.to_dict())), source=topo.source)
    assert again == topo


def test_defaults_for_optional_fields() -> None:
    topo = topology_from_dict({"numa_nodes": [{"id": 0, "cpus": "0-1"}, {"id": 1, "cpus": "2"}]})
    assert topo.gpus == () and topo.distance(0, 1) == 20 and topo.distance(1, 1) == 10
    assert topology_from_dict(two_nodes(numa_node=None)).gpus[0].numa_node == UNKNOWN_NUMA
    bus = topology_from_dict(two_nodes(pci_bus_id="00000000:3B:00.0")).gpus[0].pci_bus_id
    assert bus == "0000:3b:00.0"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "<root>"),
        ({"numa_nodes": []}, "numa_nodes="),
        ({"version": 2, "numa_nodes": [{"id": 0, "cpus": "0"}]}, "version="),
        ({"numa_nodes": [{"id": 0, "cpus": "0"}, {"id": 1, "cpus": "3-1"}]}, "numa_nodes[1].cpus="),
        ({"numa_nodes": [{"id": 0, "cpus": ["a"]}]}, "numa_nodes[0].cpus="),
        ({"numa_nodes": [{"id": -1, "cpus": "0"}]}, "numa_nodes[0].id="),
        ({"numa_nodes": [{"id": 0, "cpus": "0"}, {"id": 0, "cpus": "1"}]}, "numa_nodes="),
        ({"numa_nodes": [{"id": 0, "cpus": "0-1"}, {"id": 1, "cpus": "1"}]}, "numa_nodes[1].cpus="),
        ({"numa_nodes": [{"id": 0, "cpus": "0", "distances": [10, 20]}]},
         "numa_nodes[0].distances="),
        ({"numa_nodes": [{"id": 0, "cpus": "0", "memory_mb": "lots"}]}, "numa_nodes[0].memory_mb="),
        (two_nodes(numa_node=2), "gpus[0].numa_node="),
        (two_nodes(index="0"), "gpus[0].index="),
        (two_nodes(uuid=7), "gpus[0].uuid="),
        ({**two_nodes(), "gpus": [{"index": 0}, {"index": 0}]}, "gpus="),
        ({**two_nodes(), "gpus": {"index": 0}}, "gpus="),
    ],
)
def test_bad_topology_names_the_field(data: object, field: str) -> None:
    with pytest.raises(TopologyError) as info:
        topology_from_dict(data)
    assert isinstance(info.value, ConfigError)
    assert f"topology({field}" in str(info.value) and "Fix:" in str(info.value)


def test_bad_files_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=f"{TOPOLOGY_ENV_VAR}.*cannot be read"):
        load_topology_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        discover_topology({TOPOLOGY_ENV_VAR: str(bad)})


def test_env_override_wins(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(two_nodes()))
    topo = discover_topology({TOPOLOGY_ENV_VAR: str(path)})
    assert topo.source == f"override:{path}" and topo.gpus[0].numa_node == 1


def test_this_machine_is_discovered() -> None:
    topo = discover_topology({})
    assert topo.numa_nodes and topo.source in ("nvml", "sysfs", "none")
    assert set(os.sched_getaffinity(0)) <= set(topo.all_cpus())


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_sysfs_numa_nodes_with_smt_order(tmp_path: Path) -> None:
    nodes, cpus = tmp_path / "node", tmp_path / "cpu"
    _write(nodes / "node0" / "cpulist", "0-1,4-5\n")
    _write(nodes / "node0" / "meminfo", "Node 0 MemTotal:       2097152 kB\n")
    _write(nodes / "node0" / "distance", "10 21\n")
    _write(nodes / "node1" / "cpulist", "2-3,6-7\n")
    _write(nodes / "node1" / "distance", "21 10\n")
    (nodes / "online").write_text("0-1\n")  # not a node directory
    for cpu in range(8):
        _write(cpus / f"cpu{cpu}" / "topology" / "thread_siblings_list", f"{cpu % 4},{cpu % 4 + 4}")
    found = discover_numa_nodes(nodes, cpus)
    assert [n.id for n in found] == [0, 1]
    assert found[0].cpus == (0, 4, 1, 5) and found[1].cpus == (2, 6, 3, 7)
    assert found[0].memory_mb == 2048 and found[1].memory_mb is None
    assert found[0].distances == {0: 10, 1: 21}


def test_no_sysfs_nodes_means_one_node_with_every_cpu(tmp_path: Path) -> None:
    (only,) = discover_numa_nodes(tmp_path / "absent", tmp_path)
    assert only.id == 0 and set(only.cpus) == os.sched_getaffinity(0)


def test_sysfs_gpus_from_proc_driver_and_pci_tree(tmp_path: Path) -> None:
    proc, pci = tmp_path / "proc", tmp_path / "pci"
    for bus, numa in (("0000:3b:00.0", "1"), ("0000:18:00.0", "0"), ("0000:af:00.0", "-1")):
        (proc / bus).mkdir(parents=True)
        _write(pci / bus / "numa_node", numa + "\n")
    gpus = discover_gpus_sysfs(proc, pci)
    assert [(g.index, g.pci_bus_id, g.numa_node) for g in gpus] == [
        (0, "0000:18:00.0", 0), (1, "0000:3b:00.0", 1), (2, "0000:af:00.0", UNKNOWN_NUMA)]
    # Without /proc/driver/nvidia: NVIDIA 3D/VGA controllers in the PCI tree, nothing else.
    _write(pci / "0000:18:00.0" / "vendor", "0x10de")
    _write(pci / "0000:18:00.0" / "class", "0x030200")
    _write(pci / "0000:3b:00.0" / "vendor", "0x10de")
    _write(pci / "0000:3b:00.0" / "class", "0x068000")  # an NVSwitch bridge, not a GPU
    _write(pci / "0000:af:00.0" / "vendor", "0x8086")
    _write(pci / "0000:af:00.0" / "class", "0x030000")
    gpus = discover_gpus_sysfs(tmp_path / "no-proc", pci)
    assert [(g.index, g.pci_bus_id, g.numa_node) for g in gpus] == [(0, "0000:18:00.0", 0)]


def test_bus_id_normalization() -> None:
    assert normalize_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert normalize_bus_id("0000:AF:00.0 ") == "0000:af:00.0"
