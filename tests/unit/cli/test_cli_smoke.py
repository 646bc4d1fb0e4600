"""One ``python -m rayguard <command>`` per top-level command, each doing its simplest real
thing in a process of its own: the entry point, the installed parsers and the exit status as
a shell sees them. Every other CLI test runs ``rayguard.cli.main`` in-process (the
``run_cli`` fixture); a subprocess costs an interpreter start, and more under load."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rayguard.cli import build_parser

EVENT = {"time": 100.0, "kind": "start", "rank": None, "node": None, "step": None,
         "attempt": 0, "detail": "fit() started"}


def _event_log(tmp_path: Path) -> list[str]:
    (tmp_path / "rayguard_events.jsonl").write_text(json.dumps(EVENT) + "\n")
    return [str(tmp_path)]


def _checkpoint(tmp_path: Path) -> list[str]:
    import torch

    from rayguard.checkpoint import save

    save(tmp_path / "checkpoint_000001", {"w": torch.ones(10), "step": 1}, step=1)
    return ["verify", str(tmp_path / "checkpoint_000001")]


def _report(tmp_path: Path) -> list[str]:
    return [*_event_log(tmp_path), "-o", str(tmp_path / "report.html"), "--json"]


def _doctor_json(out: str) -> bool:
    data = json.loads(out)
    return data["address"] is None and isinstance(data["findings"], list)


# command -> (its arguments after setting up tmp_path, the exit statuses it may give, a check
# of its stdout). doctor's status depends on this machine's set-up: 0 or 1, never 2.
SMOKE: dict[str, tuple[Callable[[Path], list[str]], tuple[int, ...], Callable[[str], bool]]] = {
    "checkpoint": (_checkpoint, (0,), lambda out: out.startswith("OK ") and "step 1" in out),
    "doctor": (lambda _: ["--address", "none", "--json"], (0, 1), _doctor_json),
    "topology": (lambda _: ["--json"], (0,), lambda out: isinstance(json.loads(out), dict)),
    "events": (_event_log, (0,), lambda out: "fit() started" in out),
    "report": (_report, (0,), lambda out: json.loads(out)["ok"] is True),
    "quarantine": (lambda tmp: ["list", str(tmp), "--json"], (0,),
                   lambda out: json.loads(out)["nodes"] == {}),
}


def _top_level_commands() -> set[str]:
    subs = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(subs[0].choices)


def test_every_top_level_command_has_one_smoke_test():
    assert set(SMOKE) == _top_level_commands()


@pytest.mark.parametrize("command", sorted(SMOKE))
def test_python_m_rayguard_command(tmp_path: Path, command: str) -> None:
    setup, statuses, check = SMOKE[command]
    argv = [command, *setup(tmp_path)]
    proc = subprocess.run([sys.executable, "-m", "rayguard", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in statuses, (argv, proc.stdout, proc.stderr)
    assert check(proc.stdout), (argv, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr


def test_run_cli_gives_the_status_a_shell_sees_and_scopes_env_and_cwd(tmp_path, run_cli,
                                                                      monkeypatch):
    """The in-process runner the other CLI tests use: argparse's exits are statuses, and the
    command's environment and directory are its own."""
    mistyped = run_cli(["evnets"])
    assert mistyped.rc == 2 and "did you mean 'events'" in mistyped.stderr
    version = run_cli(["--version"])
    assert version.rc == 0 and version.stdout.startswith("rayguard ")
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    doctor = run_cli(["doctor", "--address", "none", "--json"], env={"NCCL_DEBUG": "INFO"})
    assert "NCCL_DEBUG_ON" in {f["code"] for f in json.loads(doctor.stdout)["findings"]}
    assert "NCCL_DEBUG" not in os.environ
    here = os.getcwd()
    _event_log(tmp_path)
    events = run_cli(["events", "."], cwd=tmp_path)
    assert events.rc == 0 and "fit() started" in events.stdout
    assert os.getcwd() == here
