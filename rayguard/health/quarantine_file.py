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

Whoever can write the run directory can write this file, so :func:`read` trusts nothing in
it: the file is read through :func:`~rayguard.checkpoint.fsio.read_bounded` (a link, a FIFO,
a device or an oversize file is refused, never followed or waited on) and each entry is
checked (:func:`entry_problem`); an invalid entry is dropped with a warning naming it. The
entries never fence every alive node of the cluster
(:func:`~rayguard.health.quarantine.fence_nodes`, applied by the run's
:class:`~rayguard.run.fence.NodeFence`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rayguard.checkpoint.fsio import atomic_write_bytes, locked, read_bounded
from rayguard.constants import QUARANTINE_FILENAME
from rayguard.health.quarantine import Quarantined
from rayguard.safejson import UnsafeJSONError, loads

logger = logging.getLogger("rayguard")

MAX_BYTES = 4 << 20
VERSION = 1
NODE_ID = re.compile(r"[0-9a-f]{8,128}")
"""A node id as Ray writes it (56 lowercase hex digits; 8 to 128 accepted)."""
MAX_REASON_CHARS = 64
MAX_DETAIL_CHARS = 1000

State = dict[str, Any]


def quarantine_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / QUARANTINE_FILENAME


def empty() -> State:
    return {"version": VERSION, "nodes": {}, "lifted": {}}


def read(path: str | os.PathLike[str]) -> State:
    """The file's state (empty when there is none), its invalid entries dropped with a
    warning. Raises ``ValueError`` (an :class:`~rayguard.safejson.UnsafeJSONError`) for a
    file that is not one: not JSON, over :data:`MAX_BYTES`, not a regular file (a link, a
    FIFO, a device), or whose ``nodes``/``lifted`` are not objects."""
    try:
        data = read_bounded(path, MAX_BYTES)
    except FileNotFoundError:
        return empty()
    except OSError as exc:  # NotRegularFileError included: never followed, never waited on
        raise UnsafeJSONError(f"{path}: not a rayguard quarantine file ({exc.strerror or exc}). "
                              "Fix: remove it (a run writes a regular file)") from None
    state = loads(data, max_bytes=MAX_BYTES, max_depth=8)
    nodes, lifted = state.get("nodes", {}), state.get("lifted", {})
    if not isinstance(nodes, dict) or not isinstance(lifted, dict):
        raise UnsafeJSONError(f"{path}: not a rayguard quarantine file (nodes, lifted)")
    return {"version": VERSION, "nodes": _valid(path, "nodes", nodes, entry_problem),
            "lifted": _valid(path, "lifted", lifted, _time_problem)}


def _valid(path: Any, section: str, entries: dict[str, Any],
           problem: Callable[[Any], str | None]) -> dict[str, Any]:
    """``entries`` whose id and value pass; each other one dropped with a warning."""
    kept = {}
    for node, value in entries.items():
        why = ("node id is not 8 to 128 lowercase hex digits" if not NODE_ID.fullmatch(node)
               else problem(value))
        if why is None:
            kept[node] = value
        else:
            logger.warning("rayguard: %s: %s entry %s dropped: %s. Fix: remove it from the "
                           "file (the next write drops it)", path, section,
                           ascii(node[:80]), why)
    return kept


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _time_problem(value: Any) -> str | None:
    return None if _number(value) else f"time {ascii(value)[:40]} is not a finite number"


def entry_problem(entry: Any) -> str | None:
    """Why a ``nodes`` entry is invalid (``None``: valid): an object with ``reason`` (a
    string), ``time`` (a finite number) and ``failures`` (a list of failure objects)."""
    if not isinstance(entry, dict):
        return f"entry is a {type(entry).__name__}, not an object"
    reason, failures = entry.get("reason"), entry.get("failures")
    if not isinstance(reason, str) or not 0 < len(reason) <= MAX_REASON_CHARS:
        return f"reason {ascii(reason)[:40]} is not a string of 1 to {MAX_REASON_CHARS} chars"
    if not _number(entry.get("time")):
        return _time_problem(entry.get("time"))
    if not isinstance(failures, list):
        return f"failures {ascii(failures)[:40]} is not a list"
    for i, failure in enumerate(failures):
        why = _failure_problem(failure)
        if why is not None:
            return f"failures[{i}]: {why}"
    return None


def _failure_problem(failure: Any) -> str | None:
    """Why one failure object (``NodeFailure.to_dict``) is invalid, ``None`` when valid."""
    if not isinstance(failure, dict):
        return f"a {type(failure).__name__}, not an object"
    attempt, rank = failure.get("attempt"), failure.get("rank")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        return f"attempt {ascii(attempt)[:40]} is not an integer >= 0"
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        return f"rank {ascii(rank)[:40]} is not an integer"
    for name, limit in (("reason", MAX_REASON_CHARS), ("detail", MAX_DETAIL_CHARS),
                        ("node", 128)):
        value = failure.get(name, "")
        if not isinstance(value, str) or len(value) > limit:
            return f"{name} {ascii(value)[:40]} is not a string of at most {limit} chars"
    return None


def attempts(entry: Any) -> list[int]:
    """The attempts an entry's failures ended (any shape: what is not a failure is
    skipped), for the messages that list them."""
    failures = entry.get("failures") if isinstance(entry, dict) else None
    if not isinstance(failures, list):
        return []
    return [f["attempt"] for f in failures if isinstance(f, dict)
            and isinstance(f.get("attempt"), int) and not isinstance(f.get("attempt"), bool)]


def recorded_nodes(events: Iterable[Any]) -> set[str]:
    """The nodes whose quarantine a run in this directory recorded (a ``node_quarantined``
    event not followed by a ``quarantine_lifted`` of that node): the entries "this run"
    wrote. The others came into the file some other way."""
    nodes: set[str] = set()
    for e in events:
        node = e.get("node") if isinstance(e, dict) else None
        if not isinstance(node, str):
            continue
        if e.get("kind") == "node_quarantined":
            nodes.add(node)
        elif e.get("kind") == "quarantine_lifted":
            nodes.discard(node)
    return nodes


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
