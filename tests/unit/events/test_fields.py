"""The one reading of a record's number fields: a bool is not a number, anything else that is
not an int or a float reads as missing."""

from __future__ import annotations

import math

import pytest

from rayguard.events.fields import event_time, integer, is_number, number


@pytest.mark.parametrize("value, expected", [
    (3, 3.0), (2.5, 2.5), (0, 0.0), (-1, -1.0),
    (True, None), (False, None), ("3", None), (None, None), ([1], None), ({"a": 1}, None),
])
def test_number_reads_ints_and_floats_as_floats_and_nothing_else(value, expected):
    assert number(value) == expected
    assert (number(value) is None) == (expected is None)
    assert is_number(value) is (expected is not None)


def test_a_non_finite_float_is_still_a_number():
    assert math.isnan(number(float("nan")))
    assert number(float("inf")) == math.inf


@pytest.mark.parametrize("value, expected", [
    (7, 7), (0, 0), (-2, -2), (True, None), (False, None), (7.0, None), ("7", None), (None, None),
])
def test_integer_reads_only_ints(value, expected):
    assert integer(value) == expected
    assert (integer(value) is None) == (expected is None)


def test_event_time_reads_the_time_field():
    assert event_time({"time": 12}) == 12.0
    assert isinstance(event_time({"time": 12}), float)
    assert event_time({"time": True}) is None
    assert event_time({"time": "noon"}) is None
    assert event_time({}) is None
