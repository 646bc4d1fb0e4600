"""JSON from a file that may come from elsewhere (a shared run directory): any bytes give
either a value or :class:`UnsafeJSONError`, never another exception.

Bounds: the document's size (``max_bytes``), the nesting depth (``max_depth``), numbers
(finite floats; in event lines integers of at most :data:`MAX_INT_DIGITS` digits), the top-level type
(``top``). ``NaN``/``Infinity`` literals are refused, or (``nonfinite="string"``, for event
logs written before the writer used strict JSON) read as the strings the writer uses today,
``"nan"``/``"inf"``/``"-inf"``. Strings come back encodable as UTF-8 (a lone surrogate escape
such as ``"\\ud800"`` becomes U+FFFD), so printing or writing them never fails.

How: the standard library's C parser reads the document (its own recursion guard stops a
deeply nested one), then one iterative walk over what it returned checks every bound. The
walk is the only Python work per value; a document whose strings need no repair is returned
as parsed, not copied.

The one parser of the package: event lines (:func:`loads_line`; the step summaries that make
up most of a long log may instead take the typed fast path of :mod:`rayguard.events.fast`,
which accepts only what this parser accepts), and manifests, shard headers and rejection
files (:mod:`rayguard.checkpoint.safejson`, which names the file in a
``CheckpointCorruptError``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

MAX_LINE_BYTES = 1 << 20
"""Longest event line read (1 MiB): an event line is a few hundred bytes."""
MAX_DEPTH = 32
"""Deepest nesting of arrays and objects accepted in an event line."""
MAX_INT_DIGITS = 19
"""Longest integer accepted (|n| < 10**19, about the int64 range)."""

_CONSTANTS = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


class UnsafeJSONError(ValueError):
    """A document rejected: not JSON, too long, too deep, a number out of bounds, or not of
    the expected top-level type. The message says which."""


def _refuse_constant(name: str) -> Any:
    raise UnsafeJSONError(f"non-finite number {name} is not allowed")


def _string_constant(name: str) -> Any:
    if name in _CONSTANTS:
        return _CONSTANTS[name]
    raise UnsafeJSONError(f"non-finite number {name} (write it as a string)")


# built once: json.loads(text, **options) would build a decoder per call
_DECODERS = {"refuse": json.JSONDecoder(parse_constant=_refuse_constant).decode,
             "string": json.JSONDecoder(parse_constant=_string_constant).decode}


def _clean(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from \\ud800-style escapes
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _is_clean(text: str) -> bool:
    return text.isascii() or _clean(text) is text


def check_bounds(value: Any, *, max_depth: int, max_int_digits: int | None) -> bool:
    """Check the bounds of a parsed ``value`` (iteratively: any depth is safe to check):
    raises :class:`UnsafeJSONError` for a container deeper than ``max_depth`` levels, a float
    that is not finite or an integer of more than ``max_int_digits`` digits. Returns whether
    every string (and key) is already encodable as UTF-8."""
    limit = 10 ** max_int_digits if max_int_digits is not None else None
    clean = True
    stack = [(value, 1)] if type(value) in (dict, list) else []
    if not stack:
        _check_scalar(value, limit)
        return not isinstance(value, str) or _is_clean(value)
    while stack:
        node, level = stack.pop()
        if level > max_depth:
            raise UnsafeJSONError(f"nested deeper than {max_depth} levels")
        if type(node) is dict:
            if clean and not "".join(node).isascii():
                clean = all(_is_clean(k) for k in node)
            children: Any = node.values()
        else:
            children = node
        for child in children:
            kind = type(child)
            if kind is float:
                if child - child != 0.0:  # inf - inf and nan - nan are nan
                    raise UnsafeJSONError(f"number {child} is out of range (not a finite float)")
            elif kind is int:
                if limit is not None and not -limit < child < limit:
                    raise UnsafeJSONError(f"integer of {len(str(abs(child)))} digits (at most "
                                          f"{max_int_digits})")
            elif kind is str:
                if clean and not child.isascii():
                    clean = _clean(child) is child
            elif kind is dict or kind is list:
                stack.append((child, level + 1))
    return clean


def _check_scalar(value: Any, limit: int | None) -> None:
    if type(value) is float and value - value != 0.0:
        raise UnsafeJSONError(f"number {value} is out of range (not a finite float)")
    if type(value) is int and limit is not None and not -limit < value < limit:
        raise UnsafeJSONError("integer out of range")


def _cleaned(value: Any) -> Any:
    """``value`` with every string and key made encodable (a copy; rarely needed)."""
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, dict):
        return {_clean(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return value


def loads(data: str | bytes | bytearray | memoryview, *, max_bytes: int,
          max_depth: int = MAX_DEPTH, top: type | tuple[type, ...] = dict,
          nonfinite: Literal["refuse", "string"] = "refuse",
          errors: Literal["strict", "replace"] = "strict",
          max_int_digits: int | None = None) -> Any:
    """Parse ``data`` (at most ``max_bytes`` bytes, ``max_depth`` levels, a ``top`` at the top).
    ``errors="replace"``: undecodable bytes become U+FFFD instead of a rejection.
    ``max_int_digits``: the longest integer (``None``: Python's own limit; a state may hold
    any int). Raises :class:`UnsafeJSONError` and nothing else."""
    size = len(data) if isinstance(data, (str, bytes, bytearray)) else data.nbytes
    if size > max_bytes:
        raise UnsafeJSONError(f"{size} bytes of JSON is over the {max_bytes}-byte limit")
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", errors=errors)
        if text.startswith("\ufeff"):  # as json.loads: a BOM is not JSON
            raise UnsafeJSONError("not valid JSON (an unexpected UTF-8 BOM)")
        value = _DECODERS[nonfinite](text)
    except UnsafeJSONError:
        raise
    except RecursionError:
        raise UnsafeJSONError(f"nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise UnsafeJSONError(f"not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(value, top):
        names = top.__name__ if isinstance(top, type) else " or ".join(t.__name__ for t in top)
        raise UnsafeJSONError(f"top-level JSON value is a {type(value).__name__}, expected "
                              f"a {names}")
    if check_bounds(value, max_depth=max_depth, max_int_digits=max_int_digits):
        return value
    return _cleaned(value)


def loads_line(data: bytes | str, *, max_bytes: int = MAX_LINE_BYTES,
               max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The JSON object on one event line. Raises :class:`UnsafeJSONError` (a ``ValueError``)
    and nothing else."""
    value: dict[str, Any] = loads(data, max_bytes=max_bytes, max_depth=max_depth, top=dict,
                                  nonfinite="string", errors="replace",
                                  max_int_digits=MAX_INT_DIGITS)
    return value
