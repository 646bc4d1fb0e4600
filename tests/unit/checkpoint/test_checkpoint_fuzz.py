"""Property: the readers of files that come from elsewhere (manifest, shard header, a shard
held in memory, the rejection list) are total. Random bytes and random JSON, alone or
spliced into a valid document, give a value or CheckpointCorruptError, never another
exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayguard import checkpoint as ck
from rayguard.checkpoint import format as fmt
from rayguard.checkpoint import rejections
from rayguard.checkpoint.manifest import MANIFEST_NAME, parse_manifest
from rayguard.checkpoint.reader import read_shard_bytes
from rayguard.exceptions import CheckpointCorruptError

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none())
scalars = st.one_of(numbers, st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30)


def _dumps(value) -> str:
    return json.dumps(value)  # writes NaN/Infinity tokens too: the reader must refuse them


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    path = ck.save(tmp_path_factory.mktemp("fuzz") / "checkpoint_000001",
                   {"w": torch.arange(6.0).reshape(2, 3), "n": 3, "t": (1, "x"), "b": b"\x00"},
                   step=1)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    shard = (path / manifest["files"][0]["path"]).read_bytes()
    return manifest, shard


def _parse_manifest(text) -> None:
    try:
        parse_manifest(text, "fuzz")
    except CheckpointCorruptError:
        pass


def _splice(doc, path: list, value):
    """``doc`` with the element at ``path`` (keys / indices, clipped to what exists) replaced."""
    out = json.loads(json.dumps(doc))
    node = out
    for i, key in enumerate(path):
        if isinstance(node, dict) and node:
            k = sorted(node)[key % len(node)]
        elif isinstance(node, list) and node:
            k = key % len(node)
        else:
            break
        if i == len(path) - 1 or not isinstance(node[k], (dict, list)):
            node[k] = value
            break
        node = node[k]
    return out


@FUZZ
@given(data=st.binary(max_size=300))
def test_manifest_reader_random_bytes(data):
    _parse_manifest(data)


@FUZZ
@given(value=json_values)
def test_manifest_reader_random_json(value):
    _parse_manifest(_dumps(value))


@FUZZ
@given(path=st.lists(st.integers(0, 50), min_size=1, max_size=4), value=json_values)
def test_manifest_reader_spliced_json(sample, path, value):
    _parse_manifest(_dumps(_splice(sample[0], path, value)))


def _parse_header(header: bytes, size: int) -> None:
    try:
        fmt.parse_header(header, size, "fuzz")
    except CheckpointCorruptError:
        pass


def _read_bytes(data: bytes) -> None:
    try:
        read_shard_bytes(data, None, "fuzz")
    except CheckpointCorruptError:
        pass


@FUZZ
@given(data=st.binary(max_size=300), size=st.integers(0, 1 << 40))
def test_header_reader_random_bytes(data, size):
    _parse_header(data, size)
    _read_bytes(data)


@FUZZ
@given(path=st.lists(st.integers(0, 50), min_size=1, max_size=6), value=json_values)
def test_header_reader_spliced_structure(sample, path, value):
    shard = sample[1]
    n = int.from_bytes(shard[:8], "little")
    header = json.loads(shard[8 : 8 + n])
    structure = json.loads(header["__metadata__"]["rayguard.structure"])
    header["__metadata__"]["rayguard.structure"] = _dumps(_splice(structure, path, value))
    raw = _dumps(_splice(header, path, value) if path[0] % 3 == 0 else header).encode()
    _parse_header(raw, 8 + len(raw) + len(shard) - 8 - n)
    _read_bytes(len(raw).to_bytes(8, "little") + raw + shard[8 + n :])


@FUZZ
@given(data=st.binary(max_size=200) | json_values.map(lambda v: _dumps(v).encode()))
def test_rejection_reader(tmp_path_factory, data):
    root = Path(tmp_path_factory.mktemp("rej"))
    (root / rejections.REJECTIONS_FILENAME).write_bytes(data)
    found = rejections.rejected(root)
    assert all(isinstance(v, str) for v in found.values())


@FUZZ
@given(data=st.binary(max_size=400), flip=st.integers(0, 10_000))
def test_memory_tier_copy_reader(sample, data, flip):
    from rayguard.checkpoint.memory import load_snapshot

    manifest = parse_manifest(json.dumps(sample[0]), "fuzz")
    name = manifest.files[0].path
    shard = bytearray(sample[1])
    shard[flip % len(shard)] ^= 0xFF
    for files in ({name: data}, {name: bytes(shard)}, [name], {name: 3}, {0: data}):
        try:
            load_snapshot(files, manifest, 0, "fuzz")
        except CheckpointCorruptError:
            pass
