"""Every repository file and folder the README and the docs name exists, and every relative
link between them points to a file that does (a renamed example left `examples/lightning.py`
in the README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("examples", "tests", "rayguard", "docs", "cluster-configs", "requirements")
NAMED = re.compile(r"`((?:" + "|".join(TOP) + r")/[^`\s]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _named(page: Path) -> list[str]:
    text = page.read_text()
    found = [m.split("::")[0].split("#")[0] for m in NAMED.findall(text)]
    return sorted({f for f in found if "*" not in f and "<" not in f and "{" not in f})


def _links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        out.append(target.split("#")[0])
    return sorted({t for t in out if t})


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_a_page_names_exists(page):
    missing = [p for p in _named(page) if not (ROOT / p.rstrip("/")).exists()]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_of_a_page_points_to_a_file(page):
    missing = [t for t in _links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


def test_the_check_sees_a_missing_path(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see `examples/lightning.py` and [x](nowhere.md)")
    assert _named(page) == ["examples/lightning.py"] and _links(page) == ["nowhere.md"]
