"""The run directory's quarantine file, ``rayguard_quarantine.json``: which nodes a run left
out, why, and which a person lifted.

Written by the run's coordinator when it quarantines a node and by ``rayguard quarantine
lift``; read by the run at each worker-group start (a lift takes effect there), by later
runs in the same run directory, by ``rayguard quarantine list`` and ``rayguard report``.
Plain JSON parsed by :mod:`rayguard.safejson` (bounded, no code from data); every write
holds a lock file beside it and replaces the file atomically, so the run and the CLI never
lose each other's change. Shape::

    {"version": 1,
     "nodes":  {"<node id>": {"reason": "killed", "time": 1.7e9, "failures": [...]}},
     "lifted": {"<node id>": 1.7e9}}
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rayguard.checkpoint.fsio import atomic_write_bytes, locked
from rayguard.constants import QUARANTINE_FILENAME
from rayguard.health.quarantine import Quarantined
from rayguard.safejson import UnsafeJSONError, loads

MAX_BYTES = 4 << 20
VERSION = 1

State = dict[str, Any]


def quarantine_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / QUARANTINE_FILENAME


def empty() -> State:
    return {"version": VERSION, "nodes": {}, "lifted": {}}


def read(path: str | os.PathLike[str]) -> State:
    """The file's state (empty when there is none). Raises ``ValueError`` (an
    :class:`~rayguard.safejson.UnsafeJSONError`) for a file that is not one."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return empty()
    state = loads(data, max_bytes=MAX_BYTES, max_depth=8)
    nodes, lifted = state.get("nodes", {}), state.get("lifted", {})
    if not isinstance(nodes, dict) or not isinstance(lifted, dict) or not all(
            isinstance(v, dict) for v in nodes.values()):
        raise UnsafeJSONError(f"{path}: not a rayguard quarantine file (nodes, lifted)")
    return {"version": VERSION, "nodes": nodes, "lifted": lifted}


def update(path: str | os.PathLike[str], change: Callable[[State], Any]) -> State:
    """Apply ``change`` to the file's state under its lock and write it back atomically;
    returns the new state."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_name(f".{path.name}.lock")):
        state = read(path)
        change(state)
        atomic_write_bytes(path, json.dumps(state, indent=1, sort_keys=True).encode("utf-8"))
    return state


def add(path: str | os.PathLike[str], quarantined: Iterable[Quarantined]) -> State:
    """Record newly quarantined nodes (a node lifted before and quarantined again loses its
    lift)."""
    entries = {q.node: {"reason": q.reason, "time": time.time(),
                        "failures": [f.to_dict() for f in q.failures]} for q in quarantined}

    def change(state: State) -> None:
        state["nodes"].update(entries)
        for node in entries:
            state["lifted"].pop(node, None)
    return update(path, change)


def lift(path: str | os.PathLike[str], nodes: Iterable[str] | None) -> list[str]:
    """Lift the quarantine of ``nodes`` (``None``: all); a node may be given by a prefix of
    its id of 6 characters or more. Returns the full ids lifted. Raises ``KeyError`` naming a
    node that is not quarantined (or whose prefix is ambiguous)."""
    lifted: list[str] = []

    def change(state: State) -> None:
        chosen = sorted(state["nodes"]) if nodes is None else [
            resolve(state, n) for n in nodes]
        now = time.time()
        for node in chosen:
            state["nodes"].pop(node, None)
            state["lifted"][node] = now
            lifted.append(node)
    update(path, change)
    return lifted


def resolve(state: State, given: str) -> str:
    """The quarantined node id ``given`` names (the full id, or a unique prefix of >= 6)."""
    if given in state["nodes"]:
        return given
    matches = [n for n in state["nodes"] if len(given) >= 6 and n.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(n[:12] for n in sorted(state["nodes"])) or "none"
    why = "is ambiguous" if matches else "is not quarantined"
    raise KeyError(f"node {given!r} {why} (quarantined: {known})")
