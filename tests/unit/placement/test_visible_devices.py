"""The one CUDA_VISIBLE_DEVICES parser: each entry's kind, the keys CUDA compares, and the
ids the worker's device pinning matches Ray's GPU ids against."""

from __future__ import annotations

import pytest

from rayguard.placement.visible_devices import (
    DeviceEntry,
    classify_entry,
    device_key,
    duplicate_keys,
    parse_visible_devices,
    visible_ids,
)

UUID0 = "GPU-1b2c3d4e-0000-1111-2222-333344445555"


def test_parse_kinds():
    kinds = [e.kind for e in parse_visible_devices(f"0, {UUID0},MIG-abc-1,gpu0")]
    assert kinds == ["index", "uuid", "mig", "invalid"]


@pytest.mark.parametrize(("raw", "kind"), [
    ("0", "index"), ("17", "index"), ("-1", "index"), ("00", "index"),
    (UUID0, "uuid"), (UUID0[:12], "uuid"), ("GPU-DEADBEEF", "uuid"),
    ("MIG-" + UUID0[4:], "mig"), (f"MIG-{UUID0}/1/0", "mig"),
    ("", "empty"),
    ("gpu0", "invalid"), ("NoDevFiles", "invalid"), ("cuda:0", "invalid"), ("1.5", "invalid"),
    ("+1", "invalid"), ("GPU-xyz", "invalid"), (f"MIG-{UUID0}/1", "invalid"),
])
def test_classify_entry(raw, kind):
    assert classify_entry(raw) == kind


def test_entries_are_stripped_and_empty_ones_kept():
    assert parse_visible_devices(" 0 , ,1,") == [
        DeviceEntry("0", "index"), DeviceEntry("", "empty"), DeviceEntry("1", "index"),
        DeviceEntry("", "empty")]
    assert parse_visible_devices("") == [] and parse_visible_devices("  ") == []


def test_entry_properties():
    minus, zero, uuid, bad = parse_visible_devices(f"-1,0,{UUID0},x")
    assert minus.negative and not minus.names_a_device
    assert not zero.negative and zero.names_a_device and uuid.names_a_device
    assert not bad.names_a_device and uuid.key == UUID0.lower()


def test_device_keys_and_duplicates():
    assert device_key("00") == "0" and device_key(" 3 ") == "3"
    assert device_key(UUID0.upper()) == device_key(UUID0)
    assert duplicate_keys(["0", "1", "00"]) == ["0"]
    assert duplicate_keys([UUID0, UUID0.upper(), "2", "2"]) == ["2", UUID0.lower()]
    assert duplicate_keys(["0", "1"]) == []


def test_parse_visible_devices_forms():
    assert visible_ids(None) is None
    assert visible_ids("") == []
    assert visible_ids("NoDevFiles") == []
    assert visible_ids(" 0, 2 ,") == ["0", "2"]


def test_visible_ids_keep_entries_as_written():
    assert visible_ids(f"{UUID0}, MIG-{UUID0}/1/0") == [UUID0, f"MIG-{UUID0}/1/0"]
    assert visible_ids("0,,1") == ["0", "1"]
