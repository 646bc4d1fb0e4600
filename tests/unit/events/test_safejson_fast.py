"""The bounded JSON parser, now the C parser plus one bounds walk, accepts and returns what
the parser it replaced (per-number hooks and a copying walk, kept below as the oracle)
did, for any bytes: the same value, or a rejection for both."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayguard.safejson import MAX_DEPTH, UnsafeJSONError, loads, loads_line

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the oracle: rayguard 0.1's safejson.loads ----------------------------------------------
def _oracle(data: Any, *, max_bytes: int, max_depth: int = MAX_DEPTH, top: Any = dict,
            nonfinite: str = "refuse", errors: str = "strict",
            max_int_digits: int | None = None) -> Any:
    consts = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}

    def constant(name: str) -> Any:
        if nonfinite == "string" and name in consts:
            return consts[name]
        raise UnsafeJSONError(name)

    def parse_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise UnsafeJSONError(text)
        return value

    def parse_int(text: str) -> int:
        if max_int_digits is not None and len(text.lstrip("-")) > max_int_digits:
            raise UnsafeJSONError(text)
        return int(text)

    def clean(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return text

    def checked(value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return clean(value)
        if isinstance(value, (dict, list)):
            if depth >= max_depth:
                raise UnsafeJSONError("deep")
            if isinstance(value, dict):
                return {clean(k): checked(v, depth + 1) for k, v in value.items()}
            return [checked(v, depth + 1) for v in value]
        return value

    if len(data) > max_bytes:
        raise UnsafeJSONError("size")
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", errors=errors)
        value = json.loads(text, parse_float=parse_float, parse_int=parse_int,
                           parse_constant=constant)
    except UnsafeJSONError:
        raise
    except RecursionError:
        raise UnsafeJSONError("deep") from None
    except (ValueError, TypeError):
        raise UnsafeJSONError("json") from None
    if not isinstance(value, top):
        raise UnsafeJSONError("top")
    return checked(value, 0)


def _outcome(fn: Any, data: Any, **options: Any) -> Any:
    try:
        return ("value", fn(data, **options))
    except UnsafeJSONError:
        return ("rejected",)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types (1 and 1.0 differ), NaN-free by construction."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


OPTIONS = [
    {"max_bytes": 1 << 20},  # checkpoint manifests: strict, no digit bound
    {"max_bytes": 1 << 20, "top": (dict, list), "max_depth": 4},
    {"max_bytes": 1 << 20, "nonfinite": "string", "errors": "replace", "max_int_digits": 19},
    {"max_bytes": 64, "top": (int, float, str, list, dict)},
]

pieces = st.sampled_from([
    "{", "}", "[", "]", ",", ":", '"k"', '"\\ud800"', '"\\udc00x"', '"\\u00e9"', '"é"', "1",
    "-0", "1e999", "-1e999", "1e-999", "1.5", "99999999999999999999", "9999999999999999999",
    "-9999999999999999999", "NaN", "Infinity", "-Infinity", "true", "null", " ", '"\\n"',
    "\ufeff", "0.1e309",
])
documents = st.lists(pieces, max_size=24).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=25)


@SETTINGS
@given(documents, st.sampled_from(range(len(OPTIONS))), st.booleans())
def test_any_document_gives_what_the_old_parser_gave(text, which, as_bytes):
    data: Any = text.encode("utf-8", "surrogatepass") if as_bytes else text
    options = OPTIONS[which]
    new, old = _outcome(loads, data, **options), _outcome(_oracle, data, **options)
    assert new[0] == old[0], (text, options, new, old)
    if new[0] == "value":
        assert _same(new[1], old[1]), (text, new, old)
        json.dumps(new[1]).encode("utf-8")  # encodable: no lone surrogate left


@SETTINGS
@given(json_values, st.sampled_from(range(len(OPTIONS))))
def test_any_json_value_gives_what_the_old_parser_gave(value, which):
    data = json.dumps(value, allow_nan=True).encode()
    options = OPTIONS[which]
    new, old = _outcome(loads, data, **options), _outcome(_oracle, data, **options)
    assert new[0] == old[0] and (new[0] == "rejected" or _same(new[1], old[1])), (data, new, old)


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_as_an_event_line(data):
    new, old = _outcome(loads_line, data), _outcome(
        _oracle, data, max_bytes=1 << 20, nonfinite="string", errors="replace",
        max_int_digits=19)
    assert new[0] == old[0] and (new[0] == "rejected" or _same(new[1], old[1]))


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 5000])
def test_depth_bound_is_exact(depth):
    line = b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    if depth <= MAX_DEPTH:
        assert loads_line(line)["a"] is not None
    else:
        with pytest.raises(UnsafeJSONError, match="nested deeper"):
            loads_line(line)


def test_a_clean_document_is_returned_as_parsed_and_a_dirty_one_repaired():
    assert loads_line(b'{"a": ["\\u00e9", {"b": 1}]}') == {"a": ["é", {"b": 1}]}
    dirty = b'{"\\ud800": ["\\udc00", {"x": "\\ud83d"}]}'
    fixed = loads_line(dirty)
    bad = "\ufffd" * 3  # each byte of the lone surrogate's UTF-8 form, as before
    assert fixed == {bad: [bad, {"x": bad}]} == _oracle(
        dirty, max_bytes=100, nonfinite="string", errors="replace", max_int_digits=19)


def test_numbers_at_the_bounds():
    assert loads_line(b'{"n": 9999999999999999999}')["n"] == 10**19 - 1
    for bad in (b'{"n": 10000000000000000000}', b'{"n": -10000000000000000000}',
                b'{"n": 1e309}', b'{"n": [1, [2, -1e999]]}'):
        with pytest.raises(UnsafeJSONError):
            loads_line(bad)
    assert loads(b"[1e308]", max_bytes=100, top=list) == [1e308]
