"""Topology: the JSON override (schema, errors naming the field) and discover_topology's
choice between it and this machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rayguard.constants import TOPOLOGY_ENV_VAR
from rayguard.exceptions import ConfigError
from rayguard.placement.model import UNKNOWN_NUMA
from rayguard.placement.schema import TopologyError, load_topology_file, topology_from_dict
from rayguard.placement.topology import discover_topology

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "topology_2socket.json"


def two_nodes(**gpu_overrides: object) -> dict:
    gpu = {"index": 0, "numa_node": 1, **gpu_overrides}
    return {"numa_nodes": [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": [4, 5, 6, 7]}],
            "gpus": [gpu]}


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


def test_topology_reexports_its_records_and_nothing_moved() -> None:
    from rayguard.placement import model, schema, topology

    assert topology.Topology is model.Topology and topology.GpuInfo is model.GpuInfo
    assert topology.TopologyError is schema.TopologyError
    assert topology.topology_from_dict is schema.topology_from_dict
    for name in ("parse_cpulist", "normalize_bus_id", "discover_gpus_sysfs", "no_such_name"):
        assert not hasattr(topology, name)  # import it from cpulist, model or discovery
