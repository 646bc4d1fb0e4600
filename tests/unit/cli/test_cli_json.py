"""Every ``rayguard`` command a user can run takes ``--json``."""

from __future__ import annotations

import argparse
import json

from rayguard.cli import build_parser


def _leaf_commands(parser: argparse.ArgumentParser, prefix: str = "rayguard"
                   ) -> list[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(prefix, parser)]
    out = []
    for name, sub in subs[0].choices.items():
        out += _leaf_commands(sub, f"{prefix} {name}")
    return out


def test_every_command_has_json():
    leaves = _leaf_commands(build_parser())
    names = {name for name, _ in leaves}
    assert {"rayguard doctor", "rayguard topology", "rayguard checkpoint verify",
            "rayguard checkpoint ls"} <= names
    missing = [name for name, p in leaves if "--json" not in p._option_string_actions]
    assert missing == [], f"commands without --json: {missing}"


def test_usage_errors_are_json_under_json(run_cli):
    def json_error(*args: str) -> dict:
        proc = run_cli(args)
        assert proc.rc == 2, proc.stderr
        return json.loads(proc.stdout)

    assert json_error("topology", "--json", "--workers", "-1")["reason"] == "config"
    assert json_error("doctor", "--json", "--env", "NOEQUALS")["reason"] == "usage"
