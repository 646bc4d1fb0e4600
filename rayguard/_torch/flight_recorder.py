"""torch's Flight Recorder, read as plain data (torch-private calls, only here).

torch (2.5+ for NCCL, 2.13 for gloo too) keeps per process group a ring buffer of the
collectives a process issued, with per-group sequence numbers, the op and the tensor
sizes, and per group the last sequence number enqueued and completed. Its size is
``TORCH_FR_BUFFER_SIZE`` (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``); torch 2.13 records
2000 entries by default, and ``0`` turns it off. The dump is taken without stack traces
(a millisecond; with them, symbolizing costs about a second).

:func:`collective_state` answers ``{pg_name: {"entered": {"seq", "op", "sizes"} | None,
"completed": int, "ranks": [int]}}``; ``{}`` when torch records nothing (no
``torch.distributed``, an older torch, the buffer turned off). DDP's gradient all-reduce,
issued by its C++ reducer, is recorded like every other collective of the group.
"""

from __future__ import annotations

import json
import logging
import pickle
from typing import Any

logger = logging.getLogger("rayguard")

_DUMPERS = ("_dump_fr_trace", "_dump_nccl_trace")
"""torch's dump functions: gloo and the generic recorder; NCCL's own (CUDA builds)."""


def _dumps() -> list[dict[str, Any]]:
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return []
    out = []
    for name in _DUMPERS:
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:  # (includeCollectives, includeStackTraces, onlyActive)
            out.append(pickle.loads(dump(True, False, False)))  # noqa: S301 - torch's own bytes
        except Exception as exc:  # a torch that dumps differently: nothing known
            logger.debug("rayguard: flight recorder %s unreadable: %s", name, exc)
    return out


def _op(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "")
    return name.split(":", 1)[-1] or "collective"


def _sizes(entry: dict[str, Any]) -> list[list[int]]:
    return [[int(n) for n in shape] for shape in entry.get("input_sizes") or []]


def _group_ranks(dump: dict[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for key, config in (dump.get("pg_config") or {}).items():
        try:
            ranks = json.loads(str(config.get("ranks", "[]")))
        except ValueError:
            continue
        out[str(config.get("name") or key)] = [int(r) for r in ranks]
    return out


def parse(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One dump's groups (see :func:`collective_state`)."""
    groups: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    for entry in dump.get("entries") or []:
        if entry.get("is_p2p"):
            continue
        pg = entry.get("process_group")
        name = str(pg[0] if isinstance(pg, (list, tuple)) and pg else entry.get("pg_id", "0"))
        seq = int(entry.get("collective_seq_id") or 0)
        if seq and seq >= int(last.get(name, {}).get("seq", 0)):
            last[name] = {"seq": seq, "op": _op(entry), "sizes": _sizes(entry)}
    ranks = _group_ranks(dump)
    for name, status in (dump.get("pg_status") or {}).items():
        enqueued = int(status.get("last_enqueued_collective", -1))
        completed = max(int(status.get("last_completed_collective", -1)), 0)
        entered = last.get(str(name))
        if entered is None or entered["seq"] != enqueued:
            entered = ({"seq": enqueued, "op": "collective", "sizes": []}
                       if enqueued > 0 else None)
        groups[str(name)] = {"entered": entered, "completed": completed,
                             "ranks": ranks.get(str(name), [])}
    return groups


def collective_state() -> dict[str, dict[str, Any]]:
    """Per process group of this process, the last collective entered and completed."""
    out: dict[str, dict[str, Any]] = {}
    for dump in _dumps():
        out.update(parse(dump))
    return out


def recording() -> bool:
    """Whether the recorder holds anything now (a group made at least one collective)."""
    return bool(collective_state())


def _buffer_env() -> str | None:
    import os

    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    return None


def available() -> bool:
    """Whether torch's recorder records this process's collectives: a dump function exists
    and the buffer is on (set > 0, or unset on torch >= 2.13, whose default is 2000)."""
    try:
        import torch
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return False
    if not any(hasattr(c10d, name) for name in _DUMPERS):
        return False
    size = _buffer_env()
    if size is not None:
        return size.isdigit() and int(size) > 0
    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 13)
