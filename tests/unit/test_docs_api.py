"""docs/api.md lists the public surface exactly: every name of every package's ``__all__``
under a heading ``## <package>``, as a row ``| `name` | stable | what it is |``, and no name
that is not exported; every subcommand of the real ``rayguard`` parser; every variable of
``KNOWN_ENV_VARS``; and every package that exports nothing, as internal. The names are read
from the live packages, so a name added to an ``__all__`` fails here until it is documented."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

import rayguard
from rayguard.cli import build_parser
from rayguard.constants import KNOWN_ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"
MARKS = ("stable", "experimental")
PACKAGE_HEADING = re.compile(r"rayguard(\.\w+)*")
CLI_SECTION = "The `rayguard` command"
ENV_SECTION = "Environment variables"
INTERNAL_SECTION = "Internal packages"

Row = tuple[str, str, str]  # (name, mark, description)


def sections(text: str) -> dict[str, list[Row]]:
    """``{heading: rows}`` for every ``## `` heading; a row is a table line whose first cell
    is one backticked name (header and separator lines are not rows)."""
    out: dict[str, list[Row]] = {}
    rows: list[Row] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            rows = out.setdefault(line[3:].strip(), [])
        elif rows is not None and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            name = re.fullmatch(r"`([^`]+)`", cells[0])
            if name and len(cells) >= 3:
                rows.append((name.group(1), cells[1], cells[-1]))
    return out


def _packages() -> list[str]:
    root = Path(rayguard.__file__).parent
    return sorted(".".join(("rayguard", *p.parent.relative_to(root).parts))
                  for p in root.rglob("__init__.py"))


def _exports(package: str) -> list[str]:
    return list(importlib.import_module(package).__all__)


PUBLIC = [p for p in _packages() if _exports(p)]
INTERNAL = [p for p in _packages() if not _exports(p)]
SECTIONS = sections(API.read_text(encoding="utf-8"))


def listing_problems(package: str, found: dict[str, list[Row]]) -> list[str]:
    """What is wrong with ``package``'s section against its live ``__all__``."""
    if package not in found:
        return [f"no section '## {package}'"]
    rows = found[package]
    names = [name for name, _, _ in rows]
    exported = set(_exports(package))
    problems = [f"{n}: exported, not listed" for n in sorted(exported - set(names))]
    problems += [f"{n}: listed, not in __all__" for n in sorted(set(names) - exported)]
    problems += [f"{n}: listed twice" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"{n}: mark {m!r}, not one of {MARKS}" for n, m, _ in rows if m not in MARKS]
    problems += [f"{n}: no description" for n, _, d in rows if not d]
    return problems


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= {f"{prefix} {name}"} | _subcommands(sub, f"{prefix} {name}")
    return found


def test_every_package_is_public_or_internal():
    assert PUBLIC and INTERNAL and sorted(PUBLIC + INTERNAL) == _packages()


@pytest.mark.parametrize("package", PUBLIC)
def test_every_exported_name_is_listed_with_a_mark(package):
    problems = listing_problems(package, SECTIONS)
    assert not problems, f"docs/api.md, ## {package}: {problems}"


def test_no_section_for_a_package_that_exports_nothing():
    headings = [h for h in SECTIONS if PACKAGE_HEADING.fullmatch(h)]
    assert sorted(headings) == PUBLIC


def test_one_object_has_one_mark():
    """A name exported by two packages (``HealthConfig``) is the same object: one mark."""
    marks: dict[int, set[str]] = {}
    for package in PUBLIC:
        module = importlib.import_module(package)
        for name, mark, _ in SECTIONS.get(package, []):
            obj = getattr(module, name, None)
            if obj is not None and not isinstance(obj, (str, int, tuple, frozenset, dict)):
                marks.setdefault(id(obj), set()).add(mark)
    assert all(len(m) == 1 for m in marks.values()), marks


def test_every_cli_subcommand_is_listed_as_stable():
    rows = SECTIONS[CLI_SECTION]
    assert {name for name, _, _ in rows} == _subcommands(build_parser(), "rayguard")
    assert {mark for _, mark, _ in rows} == {"stable"}


def test_every_environment_variable_is_listed():
    rows = SECTIONS[ENV_SECTION]
    assert sorted(name for name, _, _ in rows) == sorted(KNOWN_ENV_VARS)
    assert all(mark in MARKS and desc for _, mark, desc in rows), rows


@pytest.mark.parametrize("package", INTERNAL)
def test_every_package_that_exports_nothing_is_named_internal(package):
    text = API.read_text(encoding="utf-8").split(f"## {INTERNAL_SECTION}", 1)[1]
    assert f"`{package}`" in text


def test_the_check_sees_an_undocumented_and_an_unexported_name(monkeypatch):
    import rayguard.train

    monkeypatch.setattr(rayguard.train, "__all__", [*rayguard.train.__all__, "brand_new"])
    assert listing_problems("rayguard.train", SECTIONS) == ["brand_new: exported, not listed"]
    monkeypatch.undo()
    extra = {"rayguard.train": [*SECTIONS["rayguard.train"], ("gone", "sometimes", "")]}
    assert listing_problems("rayguard.train", extra) == [
        "gone: listed, not in __all__", "gone: mark 'sometimes', not one of "
        "('stable', 'experimental')", "gone: no description"]
    assert listing_problems("rayguard.train", {}) == ["no section '## rayguard.train'"]
