"""An editable install (``pip install -e .``, what ``make setup`` runs) of a checkout in a folder
named ``rayguard`` imports the package, not the checkout, from the folder above it.

Python's path finder sees the checkout ``<parent>/rayguard`` (no ``__init__.py``) on
``sys.path[0]`` as a namespace package; setuptools' editable import hook (its default for a
flat layout) comes after that finder, so ``import rayguard`` gave the empty namespace
(``module 'rayguard' has no attribute 'RobustTrainer'``). A plain ``.pth`` path (the layout
pyproject declares) puts the package's parent on ``sys.path``, where the path finder prefers a
regular package to any namespace portion. Built for real with setuptools' PEP 660 hook, in
a checkout-like tree; nothing is installed into the venv.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_named_rayguard_does_not_shadow_the_package(tmp_path):
    checkout = tmp_path / "rayguard"  # git clone ... rayguard
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    shutil.copytree(ROOT / "rayguard", checkout / "rayguard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    subprocess.run([sys.executable, "-c",
                    "import sys; from setuptools import build_meta; "
                    "build_meta.build_editable(sys.argv[1])", str(wheels)],
                   cwd=checkout, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("*.whl")
    site_dir = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site_dir)

    # A script in the checkout's parent: sys.path[0] is that parent. -S: no other install,
    # -E: no PYTHONPATH.
    probe = ("import importlib.util, json, site, sys\n"
             "site.addsitedir(sys.argv[1])\n"
             "spec = importlib.util.find_spec('rayguard')\n"
             "print(json.dumps({'origin': spec.origin,\n"
             "                  'paths': list(spec.submodule_search_locations or [])}))\n")
    (tmp_path / "probe.py").write_text(probe)
    done = subprocess.run([sys.executable, "-E", "-S", "probe.py", str(site_dir)], cwd=tmp_path,
                          check=True, capture_output=True, text=True, timeout=120)
    found = json.loads(done.stdout)
    assert found["origin"] == str(checkout / "rayguard" / "__init__.py"), found
    assert found["paths"] == [str(checkout / "rayguard")]
