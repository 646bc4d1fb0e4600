"""JSON from files that come from elsewhere: bounded, finite, of the expected shape.

Every JSON document rayguard reads back from a run directory (a manifest, a shard header,
the rejection list) goes through :func:`loads`: any bytes give either a value or one
:class:`~rayguard.exceptions.CheckpointCorruptError` naming the file and what is wrong,
never another exception. The document's size and nesting depth are bounded, ``NaN`` and
``Infinity`` (and numbers that overflow to them, such as ``1e999``) are refused, and the
top-level type is checked. :func:`int_field` and :func:`float_field` read one number with
bounds, so a value such as ``"step": 1e999`` is a rejection, not an ``OverflowError``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from rayguard.checkpoint.fsio import read_bounded
from rayguard.exceptions import CheckpointCorruptError

MAX_DEPTH = 64
"""Default nesting bound: well under Python's recursion limit, so every recursive reader of
the parsed value is safe."""
INT64_MAX = 2**63 - 1


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range (not a finite float)")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def depth(value: Any, limit: int) -> int:
    """Nesting depth of ``value`` (iterative), stopping early past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def loads(data: str | bytes | bytearray | memoryview, where: str, *, max_bytes: int,
          max_depth: int = MAX_DEPTH, top: type | tuple[type, ...] = dict) -> Any:
    """Parse ``data`` as JSON of at most ``max_bytes`` bytes and ``max_depth`` levels whose
    top-level value is a ``top``; raises CheckpointCorruptError (naming ``where``) otherwise."""

    def bad(what: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"{where}: {what}; the file is corrupt or was not written "
                                      "by rayguard")

    size = len(data) if isinstance(data, (str, bytes, bytearray)) else data.nbytes
    if size > max_bytes:
        raise bad(f"{size} bytes of JSON is over the {max_bytes}-byte limit")
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        value = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except RecursionError:
        raise bad(f"JSON nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise bad(f"not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(value, top):
        names = top.__name__ if isinstance(top, type) else " or ".join(t.__name__ for t in top)
        raise bad(f"top-level JSON value is a {type(value).__name__}, expected a {names}")
    if depth(value, max_depth) > max_depth:
        raise bad(f"JSON nested deeper than {max_depth} levels")
    return value


def read_file(path: str | os.PathLike[str], where: str, *, max_bytes: int,
              max_depth: int = MAX_DEPTH, top: type | tuple[type, ...] = dict) -> Any:
    """:func:`loads` of the file at ``path``, reading at most ``max_bytes + 1`` bytes.

    ``FileNotFoundError`` propagates (the caller knows what a missing file means); any other
    OS error is a CheckpointCorruptError."""
    try:
        data = read_bounded(path, max_bytes)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointCorruptError(f"{where}: unreadable ({exc})") from None
    return loads(data, where, max_bytes=max_bytes, max_depth=max_depth, top=top)


def int_field(value: Any, name: str, lo: int = 0, hi: int = INT64_MAX) -> int:
    """``value`` as an int in ``[lo, hi]``; ValueError naming ``name`` otherwise (bools and
    floats are refused: rayguard writes integers as integers)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is {str(value)[:40]!r} ({type(value).__name__}), not an integer")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {value} is outside [{lo}, {hi}]")
    return value


def float_field(value: Any, name: str) -> float:
    """``value`` as a finite float (an int is accepted); ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} is {str(value)[:40]!r} ({type(value).__name__}), not a number")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{name} {str(value)[:40]} is out of range") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} {value} is not finite")
    return out
