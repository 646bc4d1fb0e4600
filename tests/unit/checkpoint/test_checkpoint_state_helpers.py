"""RNG capture/restore and DDP key normalisation."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rayguard.checkpoint import (
    RNG_STATE_KEY,
    capture_rng_state,
    load,
    normalize_state_dict_keys,
    restore_rng_state,
    save,
)
from rayguard.exceptions import CheckpointError


def _draws() -> tuple:
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3).tolist())


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()
    random.gauss(0, 1)  # leave a cached gaussian in python's RNG
    save(tmp_path / "c", {RNG_STATE_KEY: capture_rng_state()})
    expected = _draws()
    _draws()  # move every RNG on
    restore_rng_state(load(tmp_path / "c")[RNG_STATE_KEY])
    assert _draws() == expected


def test_rng_state_holds_no_arbitrary_objects() -> None:
    state = capture_rng_state()
    assert isinstance(state["torch"], torch.Tensor) and state["cuda"] is None
    assert isinstance(state["python"]["state"], torch.Tensor)


def test_ddp_prefix_is_added_or_stripped_to_match_the_target() -> None:
    model = torch.nn.Linear(2, 2)
    wrapped_keys = {f"module.{k}": v for k, v in model.state_dict().items()}
    assert set(normalize_state_dict_keys(wrapped_keys, like=model.state_dict())) == {"weight", "bias"}
    unwrapped = normalize_state_dict_keys(model.state_dict(), like=wrapped_keys)
    assert set(unwrapped) == {"module.weight", "module.bias"}
    model.load_state_dict(normalize_state_dict_keys(wrapped_keys, like=model.state_dict()))
    compiled = {f"_orig_mod.{k}": v for k, v in wrapped_keys.items()}
    assert set(normalize_state_dict_keys(compiled)) == {"weight", "bias"}


def test_unknown_keys_are_kept_so_strict_loading_still_reports_them() -> None:
    out = normalize_state_dict_keys({"module.extra": 1, "module.weight": 2}, like={"weight": 0})
    assert out == {"module.extra": 1, "weight": 2}


def test_colliding_keys_are_an_error() -> None:
    with pytest.raises(CheckpointError, match="both map to 'weight'"):
        normalize_state_dict_keys({"module.weight": 1, "weight": 2}, like={"weight": 0, "bias": 0})
