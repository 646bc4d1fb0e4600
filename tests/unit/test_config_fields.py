"""A misspelt config field gets a rayguard.ConfigError naming the class, the field and the
nearest valid one; still a TypeError (what Python raised before) for existing handlers."""

from __future__ import annotations

import pickle

import pytest

import rayguard
from rayguard.exceptions import UnknownFieldError
from rayguard.serialization import SerializerPolicy
from rayguard.tune import SweepHealthConfig

TYPOS = [
    (rayguard.GuardConfig, {"sed": 0}, "seed=0"),
    (rayguard.HealthConfig, {"stall_timout_s": 5}, "stall_timeout_s=5"),
    (rayguard.CheckpointConfig, {"memory_teir": True}, "memory_tier=True"),
    (SweepHealthConfig, {"windw": 3}, "window=3"),
    (SerializerPolicy, {"zerocopy": False}, "zero_copy=False"),
]


@pytest.mark.parametrize(("cls", "kwargs", "meant"), TYPOS, ids=[t[0].__name__ for t in TYPOS])
def test_a_misspelt_field_names_the_class_the_field_and_the_nearest_one(cls, kwargs, meant):
    with pytest.raises(rayguard.ConfigError) as caught:
        cls(**kwargs)
    error = caught.value
    assert isinstance(error, TypeError)  # `except TypeError` keeps catching it
    (field, value), = kwargs.items()
    assert str(error).startswith(f"{cls.__name__}({field}={value!r}): ")
    assert f"Fix: did you mean {meant}?" in str(error)
    again = pickle.loads(pickle.dumps(error))  # it crosses Ray processes
    assert type(again) is UnknownFieldError and str(again) == str(error)


def test_a_field_like_no_other_lists_the_valid_ones():
    with pytest.raises(UnknownFieldError, match=r"Fix: use one of GuardConfig's fields .*seed"):
        rayguard.GuardConfig(zzzz=1)


def test_valid_fields_positional_arguments_and_replace_still_work():
    import dataclasses

    guard = rayguard.GuardConfig(seed=3, health=rayguard.HealthConfig(stall_timeout_s=5))
    assert dataclasses.replace(guard, seed=4).seed == 4
    assert rayguard.GuardConfig(7).seed == 7
    assert pickle.loads(pickle.dumps(guard)) == guard
    with pytest.raises(rayguard.ConfigError, match=r"stall_timeout_s=0"):  # values still checked
        rayguard.HealthConfig(stall_timeout_s=0)
