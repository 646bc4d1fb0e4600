"""The kernel's cpulist format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayguard.placement.cpulist import format_cpulist, parse_cpulist


def test_cpulist_parse_and_format() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_cpulist("5-2")


@given(st.sets(st.integers(0, 300), max_size=60))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(sorted(cpus))) == sorted(cpus)
