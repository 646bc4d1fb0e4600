"""The probe task as the runner ships it: pickled by value with the discovery it reads the
machine through, it runs in a process where rayguard cannot be imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from rayguard.doctor import probe as probe_module
from rayguard.doctor.runner import SHIPPED_MODULES, _from_dict, shipped_by_value

OPTIONAL = {"psutil", "pynvml"}  # imported inside a function, failure tolerated

RUN_WITHOUT_RAYGUARD = """
import importlib.abc, json, pickle, sys

class NoRayguard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rayguard":
            raise ImportError("rayguard is not installed on this node")
        return None

sys.meta_path.insert(0, NoRayguard())
import ray.cloudpickle  # what a Ray worker unpickles the task with
probe_on_node = pickle.loads(sys.stdin.buffer.read())
record = probe_on_node({"CUDA_VISIBLE_DEVICES": "0"}, None, 0.0, "0123456789abcdef")
assert not [m for m in sys.modules if m.split(".")[0] == "rayguard"]
print(json.dumps(record))
"""


def test_shipped_modules_import_only_the_standard_library() -> None:
    shipped = {m.__name__ for m in SHIPPED_MODULES}
    for module in SHIPPED_MODULES:
        for node in ast.walk(ast.parse(Path(module.__file__ or "").read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert (name in shipped or top == "__future__" or top in sys.stdlib_module_names
                        or top in OPTIONAL), f"{module.__name__} imports {name}"
    assert probe_module in SHIPPED_MODULES


def test_probe_task_runs_where_rayguard_is_not_installed() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    with shipped_by_value():
        payload = cloudpickle.dumps(probe_module.probe_on_node)
    out = subprocess.run([sys.executable, "-c", RUN_WITHOUT_RAYGUARD], input=payload,
                         capture_output=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr.decode()
    import json

    probe = _from_dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    assert probe.node.endswith("/01234567") and probe.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert probe.numa_nodes >= 1 and probe.cpu_count >= 1
    assert probe.gpus is None or isinstance(probe.gpus, list)
