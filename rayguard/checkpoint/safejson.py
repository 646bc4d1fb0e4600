"""JSON from files that come from elsewhere: bounded, finite, of the expected shape.

Every JSON document rayguard reads back from a run directory (a manifest, a shard header,
the rejection list) goes through :func:`loads` (the package's one parser,
:mod:`rayguard.safejson`, with the file named in the error): any bytes give either a value or one
:class:`~rayguard.exceptions.CheckpointCorruptError` naming the file and what is wrong,
never another exception. The document's size and nesting depth are bounded, ``NaN`` and
``Infinity`` (and numbers that overflow to them, such as ``1e999``) are refused, and the
top-level type is checked. :func:`int_field` and :func:`float_field` read one number with
bounds, so a value such as ``"step": 1e999`` is a rejection, not an ``OverflowError``.
"""

from __future__ import annotations

import math
import os
from typing import Any

from rayguard import safejson as _safejson
from rayguard.checkpoint.fsio import read_bounded
from rayguard.exceptions import CheckpointCorruptError

MAX_DEPTH = 64
"""Default nesting bound: well under Python's recursion limit, so every recursive reader of
the parsed value is safe."""
INT64_MAX = 2**63 - 1


def depth(value: Any, limit: int) -> int:
    """Nesting depth of ``value`` (iterative), stopping early past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads(data: str | bytes | bytearray | memoryview, where: str, *, max_bytes: int,
          max_depth: int = MAX_DEPTH, top: type | tuple[type, ...] = dict) -> Any:
    """Parse ``data`` as JSON of at most ``max_bytes`` bytes and ``max_depth`` levels whose
    top-level value is a ``top`` (:func:`rayguard.safejson.loads`); raises
    CheckpointCorruptError (naming ``where``) otherwise."""
    try:
        return _safejson.loads(data, max_bytes=max_bytes, max_depth=max_depth, top=top)
    except _safejson.UnsafeJSONError as exc:
        raise CheckpointCorruptError(f"{where}: {exc}; the file is corrupt or was not written "
                                     "by rayguard") from None


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
