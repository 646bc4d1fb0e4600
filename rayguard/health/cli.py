"""``rayguard quarantine list RUN_DIR [--json]`` and ``rayguard quarantine lift RUN_DIR
NODE... | --all``: the nodes a run left out (:mod:`rayguard.health.quarantine_file`).

A lift takes effect for a running run at its next worker-group start, and for every later
run in the same run directory. ``list`` says where each entry came from: ``this run`` when the
directory's event log records its ``node_quarantined`` (and no later lift), ``file`` when
only the file names it (an earlier run without a log, or whoever else wrote the file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rayguard.events.read import read as read_events
from rayguard.exceptions import RayGuardError
from rayguard.health import quarantine_file
from rayguard.inert import inert


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "quarantine", help="list or lift the nodes a run quarantined (left out of its workers)")
    sub = p.add_subparsers(dest="quarantine_command", metavar="ACTION")
    p_list = sub.add_parser("list", help="the quarantined nodes of a run directory")
    p_list.add_argument("run_dir", help="run directory (Result.path)")
    p_list.add_argument("--json", action="store_true", help="print the file's state as JSON")
    p_list.set_defaults(func=cmd_list)
    p_lift = sub.add_parser(
        "lift", help="admit quarantined nodes again (a running run: at its next worker-group "
                     "start)")
    p_lift.add_argument("run_dir", help="run directory (Result.path)")
    p_lift.add_argument("nodes", nargs="*", help="node ids (or unique prefixes of >= 6 chars)")
    p_lift.add_argument("--all", action="store_true", help="lift every quarantined node")
    p_lift.add_argument("--json", action="store_true",
                        help='print {"ok", "lifted"} or {"ok": false, "error"} as JSON')
    p_lift.set_defaults(func=cmd_lift)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _fail(args: argparse.Namespace, message: str, code: int = 2) -> int:
    """Report an error: on stderr, or as ``{"ok": false, "error"}`` under ``--json``."""
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": message}))
    else:
        print(f"rayguard quarantine: {inert(message)}", file=sys.stderr)
    return code


def _path(args: argparse.Namespace) -> str | None:
    run_dir = args.run_dir
    if "://" in run_dir:
        _fail(args, f"{run_dir} is remote; the quarantine file is kept only in local run "
              "directories")
        return None
    if not os.path.isdir(run_dir):
        _fail(args, f"no directory {run_dir}. Fix: pass the run directory (Result.path)")
        return None
    return str(quarantine_file.quarantine_path(run_dir))


def cmd_list(args: argparse.Namespace) -> int:
    path = _path(args)
    if path is None:
        return 2
    try:
        state = quarantine_file.read(path)
    except (OSError, ValueError) as exc:
        return _fail(args, str(exc))
    sources = entry_sources(state, _recorded(args.run_dir))
    if args.json:
        print(json.dumps(dict(state, sources=sources), sort_keys=True))
        return 0
    print(format_state(state, sources))
    return 0


def _recorded(run_dir: str) -> set[str]:
    """The nodes the run directory's event log records as quarantined (none without a log)."""
    try:
        return quarantine_file.recorded_nodes(read_events(run_dir))
    except (OSError, ValueError, RayGuardError):
        return set()


def entry_sources(state: dict[str, Any], recorded: set[str]) -> dict[str, str]:
    """Node -> ``"this run"`` (its quarantine is in the event log) or ``"file"``."""
    return {n: "this run" if n in recorded else "file" for n in state["nodes"]}


def format_state(state: dict[str, Any], sources: dict[str, str] | None = None) -> str:
    """The quarantine as lines a person reads (node, source, reason, attempts; lifted ones
    after). Entries of any shape print (what is not a reason or a detail reads ``?``)."""
    if not state["nodes"]:
        lines = ["no node is quarantined"]
    else:
        lines = ["quarantined nodes (left out of every later worker group; source: this run's "
                 "event log, or only the file):"]
        for node, entry in sorted(state["nodes"].items()):
            lines.append(inert(_entry_line(node, entry, (sources or {}).get(node, "file"))))
    if state["lifted"]:
        lines.append("lifted: " + inert(", ".join(str(n)[:12] for n in sorted(state["lifted"]))))
    return "\n".join(lines)


def _entry_line(node: str, entry: Any, source: str) -> str:
    entry = entry if isinstance(entry, dict) else {}
    reason = entry.get("reason")
    failures = entry.get("failures")
    last = failures[-1] if isinstance(failures, list) and failures else None
    detail = last.get("detail") if isinstance(last, dict) else None
    attempts = ", ".join(map(str, quarantine_file.attempts(entry))) or "?"
    return (f"  {node}  [{source}]  {reason if isinstance(reason, str) else '?'}  attempts "
            f"{attempts}" + (f"  ({detail[:120]})" if isinstance(detail, str) and detail else ""))


def cmd_lift(args: argparse.Namespace) -> int:
    path = _path(args)
    if path is None:
        return 2
    if bool(args.nodes) == bool(args.all):
        return _fail(args, "lift: name the node(s) to lift, or pass --all (not both)")
    try:
        lifted = quarantine_file.lift(path, None if args.all else args.nodes)
    except KeyError as exc:
        return _fail(args, f"lift: {exc.args[0]}", 1)
    except (OSError, ValueError, RayGuardError) as exc:
        return _fail(args, f"lift: {exc}")
    if args.json:
        print(json.dumps({"ok": True, "lifted": lifted}))
        return 0
    if not lifted:
        print("no node was quarantined")
    for node in lifted:
        print(f"lifted {node}: admitted again from the next worker-group start")
    return 0
