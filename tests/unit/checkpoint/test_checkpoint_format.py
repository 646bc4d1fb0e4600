"""Shard format: every dtype and container round-trips; nothing is unpickled; bad input fails clearly."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from rayguard.checkpoint import load, save
from rayguard.checkpoint.format import _QUANTIZED, build_header, encode
from rayguard.checkpoint.writer import shard_file_name
from rayguard.exceptions import CheckpointCorruptError, SerializationError


def _all_dtypes() -> list[torch.dtype]:
    names = sorted(n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype))
    return sorted({getattr(torch, n) for n in names} - _QUANTIZED, key=str)


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = torch.empty(shape, dtype=dtype)
    raw = torch.randint(0, 256, (n * t.element_size(),), dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    _bytes_of(t)[:] = raw.numpy().tobytes()
    return t


def _bytes_of(t: torch.Tensor) -> memoryview:
    from rayguard.checkpoint.format import raw_view

    return raw_view(t, t.numel() * t.element_size())


@pytest.mark.parametrize("dtype", _all_dtypes(), ids=str)
def test_every_torch_dtype_round_trips_bit_exact(tmp_path: Path, dtype: torch.dtype) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"t": _random_tensor(dtype, (3, 5)), "scalar": _random_tensor(dtype, ()), "empty": torch.empty(0, 2, dtype=dtype)}
        save(tmp_path / "c", state)
        out = load(tmp_path / "c")
    for key in state:
        assert out[key].dtype == dtype and out[key].shape == state[key].shape
        assert bytes(_bytes_of(out[key])) == bytes(_bytes_of(state[key])), key


def test_nested_containers_and_plain_values_round_trip(tmp_path: Path) -> None:
    shared = torch.arange(6.0).reshape(2, 3)
    state = {
        "model": {"w": shared, "tied": shared, "view": torch.arange(10.0)[::2], "t": torch.randn(3, 4).t()},
        "optim": {"state": {0: {"step": torch.tensor(5.0)}, 1: {}}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}]},
        "floats": [float("nan"), float("inf"), -float("inf"), 1.5, -0.0],
        "misc": (None, True, False, 2**70, "s", b"\x00\xff", 1 + 2j, torch.bfloat16, torch.device("cpu")),
        "np": {"a": np.arange(12, dtype=np.float16).reshape(3, 4), "s": np.float32(2.5), "i": np.int64(7)},
        (1, "k"): "tuple key",
        3.5: "float key",
        None: "none key",
        "param": torch.nn.Parameter(torch.ones(2)),
    }  # fmt: skip
    save(tmp_path / "c", state)
    out = load(tmp_path / "c")
    assert out["model"]["w"] is out["model"]["tied"]
    assert torch.equal(out["model"]["view"], torch.arange(10.0)[::2])
    assert torch.equal(out["model"]["t"], state["model"]["t"])
    assert out["optim"]["state"][0]["step"].item() == 5.0 and out["optim"]["state"][1] == {}
    assert out["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert math.isnan(out["floats"][0]) and out["floats"][1:4] == [math.inf, -math.inf, 1.5]
    assert math.copysign(1, out["floats"][4]) == -1
    assert out["misc"] == state["misc"]
    assert out["np"]["a"].dtype == np.float16 and np.array_equal(out["np"]["a"], state["np"]["a"])
    assert out["np"]["s"] == np.float32(2.5) and isinstance(out["np"]["s"], np.float32)
    assert out[(1, "k")] == "tuple key" and out[3.5] == "float key" and out[None] == "none key"
    assert out["param"].requires_grad


class Custom:
    pass


@pytest.mark.parametrize(
    "state, fragment",
    [
        ({"a": {"b": Custom()}}, "state['a']['b']: cannot checkpoint a value of type"),
        ({"a": [torch.ones(2).to_sparse()]}, "state['a'][0]: tensor of dtype torch.float32"),
        ({"a": np.array([object()])}, "numpy array of dtype object"),
        ({"a": torch.empty(2, device="meta")}, "meta device"),
        ({frozenset(): 1}, "dict key frozenset()"),
    ],
)
def test_unsupported_values_fail_before_anything_is_written(tmp_path: Path, state: dict, fragment: str) -> None:
    with pytest.raises(SerializationError, match="Fix:") as info:
        save(tmp_path / "c", state)
    assert fragment in str(info.value)
    assert not (tmp_path / "c").exists()
    assert list(tmp_path.iterdir()) == []  # staging removed too


def test_shard_is_a_valid_safetensors_file(tmp_path: Path) -> None:
    from safetensors import safe_open

    state = {"w": torch.randn(4, 4).bfloat16(), "c": torch.randn(3, dtype=torch.complex128), "n": 3}
    save(tmp_path / "c", state)
    with safe_open(str(tmp_path / "c" / shard_file_name(0)), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        assert f.metadata()["format"] == "rayguard-shard"
    assert torch.equal(tensors["0"], state["w"])
    assert tensors["1"].dtype == torch.uint8 and tensors["1"].numel() == 3 * 16  # raw bytes


def test_loading_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    save(tmp_path / "c", {"w": torch.ones(3), "x": [1, "a"]})

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("pickle used during load")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(torch, "load", boom)
    assert load(tmp_path / "c")["x"] == [1, "a"]


def test_a_corrupt_header_is_rejected_even_without_verification(tmp_path: Path) -> None:
    save(tmp_path / "c", {"w": torch.ones(1000)})
    shard = tmp_path / "c" / shard_file_name(0)
    data = bytearray(shard.read_bytes())
    structure, entries = encode({"w": torch.ones(2000)})  # claims more payload than exists
    header = build_header(structure, entries)
    shard.write_bytes(header + data[len(header) :])
    with pytest.raises(CheckpointCorruptError, match="shard header is invalid"):
        load(tmp_path / "c", verify=False)
    with pytest.raises(CheckpointCorruptError):
        load(tmp_path / "c")
