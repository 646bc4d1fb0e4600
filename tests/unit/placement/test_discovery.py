"""Discovery over real files laid out like /sys, /proc and /dev, and its promise to the
doctor: the module (with the records it builds) imports and runs on the standard library
alone, since the doctor ships it by value to nodes that may not have rayguard."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rayguard.placement import cpulist, discovery, model
from rayguard.placement.discovery import (
    discover_gpus_sysfs,
    discover_numa_nodes,
    gpus_from_proc,
    numa_node_ids,
    nvidia_device_files,
    parse_nvidia_smi,
)
from rayguard.placement.model import UNKNOWN_NUMA, GpuInfo, normalize_bus_id

STDLIB_ONLY = (cpulist, model, discovery)
OPTIONAL = {"pynvml"}  # imported inside a function, ImportError tolerated


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


def test_numa_node_ids_skip_other_entries(tmp_path: Path) -> None:
    for name in ("node1", "node0", "node10", "online", "has_cpu", "nodeX"):
        (tmp_path / name).mkdir()
    assert numa_node_ids(tmp_path) == [0, 1, 10]
    assert numa_node_ids(tmp_path / "absent") == []


def test_proc_gpus_carry_uuid_and_model(tmp_path: Path) -> None:
    proc, pci = tmp_path / "proc", tmp_path / "pci"
    _write(proc / "0000:86:00.0" / "information",
           "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n"
           "GPU UUID: \t GPU-9f8e7d6c-0000-1111-2222-333344445555\n")
    (proc / "0000:3b:00.0").mkdir()  # no information file: still a GPU
    _write(pci / "0000:86:00.0" / "numa_node", "1\n")
    assert gpus_from_proc(proc, pci) == (
        GpuInfo(0, UNKNOWN_NUMA, "0000:3b:00.0"),
        GpuInfo(1, 1, "0000:86:00.0", "GPU-9f8e7d6c-0000-1111-2222-333344445555",
                "NVIDIA H100 80GB HBM3"))
    assert gpus_from_proc(tmp_path / "no-driver", pci) is None
    (tmp_path / "empty").mkdir()
    assert gpus_from_proc(tmp_path / "empty", pci) == ()


def test_nvidia_smi_lines(tmp_path: Path) -> None:
    _write(tmp_path / "0000:3b:00.0" / "numa_node", "0\n")
    out = ("0, GPU-aaaa, NVIDIA A100-SXM4-80GB, 00000000:3B:00.0\n"
           "1, GPU-bbbb, NVIDIA A100-SXM4-80GB, 00000000:86:00.0\n"
           "No devices were found\n")
    assert parse_nvidia_smi(out, tmp_path) == (
        GpuInfo(0, 0, "0000:3b:00.0", "GPU-aaaa", "NVIDIA A100-SXM4-80GB"),
        GpuInfo(1, UNKNOWN_NUMA, "0000:86:00.0", "GPU-bbbb", "NVIDIA A100-SXM4-80GB"))
    assert parse_nvidia_smi("") == ()


def test_device_files(tmp_path: Path) -> None:
    assert not nvidia_device_files(tmp_path)
    (tmp_path / "nvidiactl").touch()
    assert not nvidia_device_files(tmp_path)
    (tmp_path / "nvidia3").touch()
    assert nvidia_device_files(tmp_path)


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(module, inside a function) for every import of a module's source."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert child.level == 0, "relative imports do not survive shipping by value"
                found.append((child.module or "", inner))
            visit(child, inner)

    visit(tree, False)
    return found


def test_discovery_imports_only_the_standard_library() -> None:
    allowed = {m.__name__ for m in STDLIB_ONLY}
    for module in STDLIB_ONLY:
        tree = ast.parse(Path(module.__file__ or "").read_text())
        for name, in_function in _imports(tree):
            top = name.split(".")[0]
            ok = (name in allowed or top == "__future__" or top in sys.stdlib_module_names
                  or (in_function and top in OPTIONAL))
            assert ok, f"{module.__name__} imports {name}"


def test_discovery_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    # The three modules alone, under empty packages: no rayguard __init__, no site-packages.
    pkg = tmp_path / "rayguard" / "placement"
    pkg.mkdir(parents=True)
    (tmp_path / "rayguard" / "__init__.py").touch()
    (pkg / "__init__.py").touch()
    for module in STDLIB_ONLY:
        shutil.copy(module.__file__ or "", pkg)
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from rayguard.placement import discovery as d\n"
            "t = d.discover_machine()\n"
            "assert t.numa_nodes and t.source in ('nvml', 'sysfs', 'none'), t\n"
            "assert d.gpus_from_proc() is None or isinstance(d.gpus_from_proc(), tuple)\n"
            "print(len(t.numa_nodes), t.to_dict()['numa_nodes'][0]['cpus'], "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('pynvml', 'psutil', 'ray')))\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env={})
    assert out.returncode == 0, out.stderr
    nodes, cpus, third_party = out.stdout.split(" ", 2)
    assert int(nodes) >= 1 and cpus and third_party.strip() == "[]"
