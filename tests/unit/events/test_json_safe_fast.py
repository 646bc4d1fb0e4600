"""json_safe's exact-type dispatch (the coordinator writes hundreds of events a second at
scale) returns what the plain recursive walk it replaced (kept below as the oracle) did, for
any nesting of the values events hold, subclasses of them included."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rayguard.events.record import json_safe


def _oracle(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _oracle(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_oracle(v) for v in value]
    return value


class Level(enum.IntEnum):
    LOW = 1


class Ratio(float):
    pass


class Name(str):
    pass


LEAVES = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
          | st.sampled_from([Level.LOW, Ratio("nan"), Ratio(1.5), Name("x")]))
KEYS = st.text(max_size=3) | st.integers(-3, 3) | st.booleans() | st.none() | st.just(Name("k"))
VALUES = st.recursive(LEAVES, lambda inner: (
    st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(KEYS, inner, max_size=4)
    | st.dictionaries(KEYS, inner, max_size=3).map(OrderedDict)), max_leaves=30)


@given(VALUES)
def test_the_fast_walk_returns_what_the_plain_walk_returned(value):
    fast, plain = json_safe(value), _oracle(value)
    assert repr(fast) == repr(plain)
    assert [type(k) for k in _keys(fast)] == [type(k) for k in _keys(plain)]


def _keys(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in (key, *_keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []
