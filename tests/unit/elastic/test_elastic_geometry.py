"""Batch geometry: valid world sizes, accumulation, lr rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayguard.elastic import (
    check_world_size,
    grad_accum_steps,
    largest_valid_at_most,
    scaled_lr,
    valid_world_sizes,
)
from rayguard.exceptions import ConfigError


def test_valid_world_sizes_examples() -> None:
    assert valid_world_sizes(64, 4, 1, 8) == [1, 2, 4, 8]
    assert valid_world_sizes(48, 2, 1, 24) == [1, 2, 3, 4, 6, 8, 12, 24]
    assert valid_world_sizes(48, 2, 5, 7) == [6]
    assert valid_world_sizes(64, 4, 3, 3) == []
    assert valid_world_sizes(10, 4, 1, 8) == []  # global not a multiple of micro


@given(st.integers(1, 600), st.integers(1, 12), st.integers(1, 40), st.integers(0, 40))
def test_valid_world_sizes_matches_definition(g: int, m: int, lo: int, span: int) -> None:
    hi = lo + span
    expected = [w for w in range(lo, hi + 1) if g % (m * w) == 0]
    assert valid_world_sizes(g, m, lo, hi) == expected


def test_large_world() -> None:
    sizes = valid_world_sizes(4096 * 8 * 3, 8, 1, 4096)
    assert sizes[-1] == 4096 and 3072 in sizes and 4095 not in sizes


def test_grad_accum_steps_keeps_global_batch() -> None:
    for w in valid_world_sizes(96, 4, 1, 24):
        assert 4 * grad_accum_steps(96, 4, w) * w == 96


def test_grad_accum_steps_error_lists_valid_sizes() -> None:
    with pytest.raises(ConfigError) as e:
        grad_accum_steps(64, 4, 3)
    msg = str(e.value)
    assert "world_size=3" in msg and "[1, 2, 4, 8, 16]" in msg and "Fix:" in msg


def test_check_world_size_names_where() -> None:
    assert check_world_size(64, 4, 2) == 8
    with pytest.raises(ConfigError, match=r"rank 3 on node n1"):
        check_world_size(64, 4, 5, where="rank 3 on node n1")


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_inputs_name_the_field(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"micro_batch_size="):
        valid_world_sizes(64, bad, 1, 4)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"world_size="):
        grad_accum_steps(64, 4, bad)  # type: ignore[arg-type]


def test_min_above_max() -> None:
    with pytest.raises(ConfigError, match=r"min_workers=5"):
        valid_world_sizes(64, 4, 5, 2)


def test_largest_valid_at_most() -> None:
    assert largest_valid_at_most(7, [1, 2, 4, 8]) == 4
    assert largest_valid_at_most(8, [1, 2, 4, 8]) == 8
    assert largest_valid_at_most(1, [2, 4]) == 0


def test_scaled_lr() -> None:
    assert scaled_lr(0.1, 4, 2) == 0.1
    assert scaled_lr(0.1, 4, 2, "linear") == pytest.approx(0.05)
    assert scaled_lr(0.1, 4, 16, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 4, 8, "sqrt") == pytest.approx(0.1 * math.sqrt(2))
    with pytest.raises(ConfigError, match="rule="):
        scaled_lr(0.1, 4, 2, "cubic")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="base_lr="):
        scaled_lr(float("nan"), 4, 2)
