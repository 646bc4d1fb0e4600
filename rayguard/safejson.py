"""One JSON line from a file that may come from elsewhere (a shared run directory), read so
that any bytes give either a value or :class:`UnsafeJSONError`, never another exception.

Bounds: the line's size (``max_bytes``), the nesting depth (``max_depth``), numbers (finite
floats; a ``NaN``/``Infinity`` literal reads as the string ``"nan"``/``"inf"``, integers of at most :data:`MAX_INT_DIGITS`
digits), the top-level type (an object). Strings come back encodable as UTF-8 (a lone
surrogate escape such as ``"\\ud800"`` becomes U+FFFD), so printing or writing them never
fails.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_LINE_BYTES = 1 << 20
"""Longest line read (1 MiB): an event or manifest line is a few hundred bytes."""
MAX_DEPTH = 32
"""Deepest nesting of arrays and objects accepted."""
MAX_INT_DIGITS = 19
"""Longest integer accepted (|n| < 10**19, about the int64 range)."""


class UnsafeJSONError(ValueError):
    """A line rejected: not JSON, too long, too deep, a number out of bounds, or not an
    object. The message says which."""


_CONSTANTS = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


def _reject_constant(name: str) -> Any:
    """A ``NaN``/``Infinity`` literal (logs written before the writer used strict JSON)
    reads as the string the writer uses today (``"nan"``, ``"inf"``, ``"-inf"``)."""
    if name in _CONSTANTS:
        return _CONSTANTS[name]
    raise UnsafeJSONError(f"non-finite number {name} (write it as a string)")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJSONError(f"number {text[:40]} is out of range")
    return value


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise UnsafeJSONError(f"integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


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


def loads_line(data: bytes | str, *, max_bytes: int = MAX_LINE_BYTES,
               max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The JSON object on one line. Raises :class:`UnsafeJSONError` (a ``ValueError``) and
    nothing else."""
    if len(data) > max_bytes:
        raise UnsafeJSONError(f"line of {len(data)} bytes (at most {max_bytes})")
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_parse_float,
                           parse_int=_parse_int)
    except UnsafeJSONError:
        raise
    except RecursionError:
        raise UnsafeJSONError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError
        raise UnsafeJSONError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UnsafeJSONError(f"a JSON {type(value).__name__}, not an object")
    checked: dict[str, Any] = _checked(value, 0, max_depth)
    return checked
