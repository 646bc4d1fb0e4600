"""What the docs and examples show runs as shown: every name a code block uses is imported
there (or is the reader's own object), no example or doc starts Ray with a bare
``ray.init(``, and a ``rayguard ...`` command an example prints runs as printed."""

from __future__ import annotations

import ast
import builtins
import os
import re
import shlex
import subprocess
import symtable
import sys
from pathlib import Path

import pytest

from rayguard.cli import shell_command

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
READERS_OWN = frozenset({
    "model", "opt", "loss", "n", "start", "steps", "epochs", "dataset", "train_fn",
    "build_model", "build", "train_step", "trainer", "steps_done", "running_on"})
"""Names doc snippets use for the reader's own objects (their model, loop bounds, data)."""


def python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for md in DOCS:
        text = md.read_text(encoding="utf-8")
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            line = text[:m.start()].count("\n") + 2
            blocks.append((f"{md.relative_to(ROOT)}:{line}", m.group(1)))
    return blocks


def undefined_names(source: str) -> set[str]:
    """Global names ``source`` reads that it never binds (imports, assignments, defs)."""
    top = symtable.symtable(source, "<block>", "exec")
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_imported() or s.is_assigned() or s.is_namespace()}
    read: set[str] = set()

    def visit(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            if sym.is_referenced() and (table is top or sym.is_global()):
                read.add(sym.get_name())
        for child in table.get_children():
            visit(child)

    visit(top)
    return read - bound - set(dir(builtins))


BLOCKS = python_blocks()


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_name_a_doc_block_uses_is_imported_there(where, source):
    missing = undefined_names(source) - READERS_OWN
    assert not missing, f"{where}: {sorted(missing)} used but not imported (NameError as shown)"


def test_the_name_check_sees_a_missing_import():
    assert undefined_names("from ray import tune\ntune.run(scheduler=ASHAScheduler())\n") \
        == {"ASHAScheduler"}
    assert undefined_names("import rayguard\n[rayguard.x(i) for i in range(3)]\n") == set()


def bare_ray_inits(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "ray.init"
            and not node.args and not any(k.arg == "address" for k in node.keywords)]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_no_example_starts_ray_with_a_bare_init(path):
    # A bare ray.init() attaches to whatever cluster `ray start` last started on the machine.
    assert bare_ray_inits(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_no_doc_starts_ray_with_a_bare_init():
    found = [f"{where} line {n}" for where, source in BLOCKS
             for n in bare_ray_inits(ast.parse(source))]
    for md in DOCS:  # inline code too; "a bare `ray.init()`" describing Ray's rule is fine
        text = md.read_text(encoding="utf-8")
        for m in re.finditer(r"ray\.init\(([^)]*)\)", text):
            explicit = re.search(r"address|^\s*[\"']", m.group(1))  # keyword or positional
            if not explicit and not re.search(r"bare\W*$", text[:m.start()][-12:]):
                found.append(f"{md.name}: {m.group(0)}")
    assert found == []


CLI_WORDS = re.compile(r"\brayguard (checkpoint|events|report|doctor|topology)\b")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_print_rayguard_commands_through_shell_command(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    printed = [ast.unparse(node) for node in ast.walk(tree)
               if isinstance(node, ast.Call) and ast.unparse(node.func) == "print"]
    bare = [p for p in printed if CLI_WORDS.search(p) or "-m rayguard" in p]
    assert bare == [], f"{path.name} prints a command that needs the venv active: {bare}"


def test_shell_command_runs_as_printed_without_the_venv_active(tmp_path):
    command = shell_command("--version")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PATH")}
    env["PATH"] = "/usr/bin:/bin"  # no venv on PATH: a bare `rayguard` is not found
    done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, (command, done.stderr)
    assert done.stdout.startswith("rayguard ")
    bare = subprocess.run("rayguard --version", shell=True, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert bare.returncode != 0  # what examples printed before


def test_shell_command_quotes_its_arguments():
    words = shlex.split(shell_command("checkpoint", "ls", "/runs/my run"))
    assert words[-3:] == ["checkpoint", "ls", "/runs/my run"]
    assert Path(words[0]).name == "rayguard" or words[:3] == [sys.executable, "-m", "rayguard"]
