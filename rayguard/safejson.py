"""JSON from a file that may come from elsewhere (a shared run directory): any bytes give
either a value or :class:`UnsafeJSONError`, never another exception.

Bounds: the document's size (``max_bytes``), the nesting depth (``max_depth``), numbers
(finite floats; in event lines integers of at most :data:`MAX_INT_DIGITS` digits), the top-level type
(``top``). ``NaN``/``Infinity`` literals are refused, or (``nonfinite="string"``, for event
logs written before the writer used strict JSON) read as the strings the writer uses today,
``"nan"``/``"inf"``/``"-inf"``. Strings come back encodable as UTF-8 (a lone surrogate escape
such as ``"\\ud800"`` becomes U+FFFD), so printing or writing them never fails.

The one parser of the package: event lines (:func:`loads_line`), and manifests, shard
headers and rejection files (:mod:`rayguard.checkpoint.safejson`, which names the file in a
``CheckpointCorruptError``).
"""

from __future__ import annotations

import json
import math
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


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJSONError(f"number {text[:40]} is out of range (not a finite float)")
    return value


def _int_parser(max_digits: int | None) -> Any:
    def parse(text: str) -> int:
        if max_digits is not None and len(text.lstrip("-")) > max_digits:
            raise UnsafeJSONError(f"integer of {len(text)} digits (at most {max_digits})")
        return int(text)  # past Python's own digit limit: ValueError, a rejection below

    return parse


def _clean(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from \\ud800-style escapes
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _checked(value: Any, depth: int, max_depth: int) -> Any:
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, (dict, list)):
        if depth >= max_depth:
            raise UnsafeJSONError(f"nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            return {_clean(k): _checked(v, depth + 1, max_depth) for k, v in value.items()}
        return [_checked(v, depth + 1, max_depth) for v in value]
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
        value = json.loads(text, parse_float=_parse_float, parse_int=_int_parser(max_int_digits),
                           parse_constant=_string_constant if nonfinite == "string"
                           else _refuse_constant)
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
    return _checked(value, 0, max_depth)


def loads_line(data: bytes | str, *, max_bytes: int = MAX_LINE_BYTES,
               max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The JSON object on one event line. Raises :class:`UnsafeJSONError` (a ``ValueError``)
    and nothing else."""
    value: dict[str, Any] = loads(data, max_bytes=max_bytes, max_depth=max_depth, top=dict,
                                  nonfinite="string", errors="replace",
                                  max_int_digits=MAX_INT_DIGITS)
    return value
