"""The Ray-internals boundary: outside ``rayguard/_ray/`` no module imports a private Ray
module or touches a private attribute of a Ray object (docs/compatibility.md lists them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rayguard

PACKAGE = Path(rayguard.__file__).parent
BOUNDARY = PACKAGE / "_ray"

# Private names of Ray objects rayguard uses; they may appear only inside rayguard/_ray/.
KNOWN_PRIVATE = frozenset({
    "_base_exc", "_local_tuner", "_TrainingResult", "_raylet",
    "_get_train_func", "_create_default_callbacks", "_initialize_and_run_controller",
    "_count_possible_workers", "_get_reserved_resources", "_latest_reserved_resources",
    "_latest_reserved_resources_query_time", "_autoscaling_coordinator", "_requester_id",
    "_coordinator_client", "_trial_to_actor", "_actor_manager", "_schedule_trial_stop",
    "_requeue_trial", "_cached_trial_decisions", "_queued_trial_decisions", "_scheduler_alg",
    "_search_alg", "_has_errored", "_iteration", "_storage", "_latest_checkpoint_result",
    "_checkpoint_results", "_getframe",
})
# Private Ray methods rayguard overrides (a module-level helper may share a name like _storage).
OVERRIDDEN = frozenset({
    "_get_train_func", "_create_default_callbacks", "_initialize_and_run_controller",
    "_count_possible_workers", "_get_reserved_resources",
})


def _private_ray_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "ray" and any(p.startswith("_") for p in parts[1:])


def violations(source: str) -> list[str]:
    """Every private-Ray use in one module's source, as ``line: what``."""
    tree = ast.parse(source)
    found: list[str] = []
    from_ray: set[str] = set()  # local names bound to Ray objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private_ray_module(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
                if alias.name.split(".")[0] == "ray":
                    from_ray.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private_ray_module(node.module):
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module.split(".")[0] == "ray":
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                    from_ray.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attr = node.attr
            if attr.startswith("__") and attr.endswith("__"):
                continue
            base = node.value
            on_ray_object = isinstance(base, ast.Name) and base.id in from_ray
            on_super = (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                        and base.func.id == "super")
            on_self = isinstance(base, ast.Name) and base.id in ("self", "cls")
            if attr.startswith("_") and (on_ray_object or on_super):
                found.append(f"{node.lineno}: .{attr} on a Ray object")
            elif attr in KNOWN_PRIVATE and not on_self:
                found.append(f"{node.lineno}: .{attr} (a known Ray internal)")
            elif attr == "dispatch" and isinstance(base, ast.Attribute) and base.attr == "CloudPickler":
                found.append(f"{node.lineno}: CloudPickler.dispatch")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in KNOWN_PRIVATE):
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in OVERRIDDEN:
            found.append(f"{node.lineno}: overrides {node.name}")
    return found


def _modules_outside_boundary() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if BOUNDARY not in p.parents)


def test_no_private_ray_access_outside_the_boundary() -> None:
    bad = {str(p.relative_to(PACKAGE.parent)): v for p in _modules_outside_boundary()
           if (v := violations(p.read_text()))}
    assert not bad, ("private Ray access outside rayguard/_ray/ (move it into a shim there and "
                     f"list it in docs/compatibility.md): {bad}")


def test_the_boundary_itself_is_where_the_internals_are() -> None:
    inside = {p.name: violations(p.read_text()) for p in BOUNDARY.glob("*.py")}
    assert inside["train.py"] and inside["tune.py"] and inside["core.py"]


@pytest.mark.parametrize("line", [
    "from ray.train.v2._internal.execution.callback import WorkerGroupCallback",
    "import ray._private.services",
    "from ray import _private",
    "from ray._raylet import RAY_NODE_ID_KEY",
    "import ray\nray._private.services.get_node_ip_address()",
    "from ray.tune import Tuner\ndef f(t: Tuner):\n    return Tuner._local_tuner",
    "def f(tuner):\n    return tuner._local_tuner.get_run_config()",
    "def f(e):\n    return getattr(e, 'x', e)._base_exc",
    "def f(e):\n    return getattr(e, '_base_exc', e)",
    "import ray.cloudpickle\nray.cloudpickle.CloudPickler.dispatch[int] = None",
    "class T:\n    def _get_train_func(self):\n        return super()._get_train_func()",
    "def f(controller):\n    controller._requeue_trial(None)",
])
def test_each_kind_of_private_use_is_caught(line: str) -> None:
    assert violations(line)


@pytest.mark.parametrize("line", [
    "import ray\nfrom ray.train import Checkpoint\nray.get([])",
    "class A:\n    def f(self):\n        return self._trials, self._callbacks",
    "from ray.util import register_serializer",
    "import os\nos._exit(0)",
])
def test_public_use_and_own_privates_pass(line: str) -> None:
    assert not violations(line)


def test_a_readded_internal_fails_the_rule(tmp_path: Path) -> None:
    """The rule as it runs on the package: a module re-adding a private import fails it."""
    module = tmp_path / "callbacks.py"
    module.write_text((PACKAGE / "controller" / "callbacks.py").read_text()
                      + "\nfrom ray.train.v2._internal.execution.callback import ControllerCallback\n")
    assert violations(module.read_text())
    assert not violations((PACKAGE / "controller" / "callbacks.py").read_text())
