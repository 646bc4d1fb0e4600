"""The ``rayguard`` command. Each capability registers its own subcommands.

A capability module exposes ``register(subparsers) -> None``; the parser it adds sets
``func`` to a callable ``(args) -> int`` (the exit status).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import shlex
import sys
from typing import NoReturn

# (module, what it adds). Listed here so `rayguard --help` is complete without scanning.
_COMMAND_MODULES = (
    "rayguard.checkpoint.cli",   # rayguard checkpoint verify|ls
    "rayguard.doctor.cli",       # rayguard doctor
    "rayguard.placement.cli",    # rayguard topology
    "rayguard.observe.cli",      # rayguard events|report
    "rayguard.health.cli",       # rayguard quarantine list|lift
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error for an unknown subcommand suggests the closest one
    (``rayguard evnets`` -> did you mean ``events``?). Subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            choices = re.findall(r"'([^']*)'", found.group(2))
            close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.5)
            if close:
                message += f"; did you mean {close[0]!r}? (`{self.prog} {close[0]} --help`)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rayguard", description="rayguard: robust PyTorch training on Ray")
    from rayguard import __version__

    parser.add_argument("--version", action="version", version=f"rayguard {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # capability not installed in this build
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rayguard.connect import install_exit_handlers

    restore = install_exit_handlers()  # Ctrl-C: exit 130, SIGTERM: 143, at any moment
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    finally:
        restore()


def shell_command(*args: str) -> str:
    """``rayguard <args>`` as a command that runs as printed, with this Python's installation
    (what examples print): the ``rayguard`` script next to ``sys.executable`` (relative to
    the current directory when it is below it, e.g. ``.venv/bin/rayguard``), which works
    without the venv being active, where a bare ``rayguard`` is not on ``PATH``; else
    ``<python> -m rayguard``."""
    script = os.path.join(os.path.dirname(sys.executable), "rayguard")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        relative = os.path.relpath(script)
        words = [relative if not relative.startswith(os.pardir) else script]
    else:
        words = [sys.executable, "-m", "rayguard"]
    return shlex.join([*words, *(str(a) for a in args)])


if __name__ == "__main__":
    sys.exit(main())
