"""Sealing a directory a loop gives to ray.train.report: each rank's records merged into one
manifest of rayguard's format, written by the lowest reporting rank; no Ray."""

from __future__ import annotations

import json

from rayguard.checkpoint import verify
from rayguard.checkpoint.fallback import candidates_of, scan
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.reported import (
    REPORTED_SOURCE,
    drop_stale_manifest,
    hash_directory,
    merge_records,
    seal,
)


def _dir(tmp_path, name, files):
    d = tmp_path / name
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def test_a_sealed_directory_verifies_and_a_flipped_byte_or_truncation_does_not(tmp_path):
    d = _dir(tmp_path, "checkpoint_a", {"model.pt": b"x" * 1000, "sub/optim.pt": b"y" * 10})
    record = hash_directory(d, 0)
    manifest = seal(d, [record, None], world_size=2, step=7)
    assert manifest.metadata["source"] == REPORTED_SOURCE
    assert verify(d).ok and verify(d).manifest.step == 7
    assert verify(d).manifest.metadata["source"] == REPORTED_SOURCE  # as written to disk
    with open(d / "model.pt", "r+b") as f:
        f.seek(500)
        f.write(b"z")
    assert not verify(d).ok and "blake3 mismatch" in verify(d).describe()
    (d / "sub/optim.pt").write_bytes(b"y")
    assert "truncated" in verify(d).describe()


def test_ranks_with_the_same_bytes_are_listed_once_and_differing_bytes_are_left_out(tmp_path):
    a = hash_directory(_dir(tmp_path, "r0", {"model.pt": b"same", "rng_0.pt": b"a"}), 0)
    b = hash_directory(_dir(tmp_path, "r1", {"model.pt": b"same", "rng_1.pt": b"b",
                                              "log.txt": b"1"}), 1)
    c = hash_directory(_dir(tmp_path, "r2", {"log.txt": b"2"}), 2)
    files, conflicts = merge_records([c, None, b, a])
    assert [(f.path, f.rank) for f in files] == [("model.pt", 0), ("rng_0.pt", 0),
                                                ("rng_1.pt", 1)]
    assert conflicts == ("log.txt",)


def test_a_stale_manifest_is_neither_hashed_nor_kept_by_a_non_writer(tmp_path):
    d = _dir(tmp_path, "r1", {"model.pt": b"m", MANIFEST_NAME: b"{}"})
    assert [f.path for f in hash_directory(d, 1).files] == ["model.pt"]
    drop_stale_manifest(d)
    drop_stale_manifest(d)  # none left: nothing to do
    assert not (d / MANIFEST_NAME).exists()


def test_load_state_scans_never_pick_a_reported_directory_and_get_checkpoint_scans_only_them(
        tmp_path):
    from rayguard.checkpoint.api import save

    save(tmp_path / "checkpoint_000001", {"w": 1}, step=1)
    d = _dir(tmp_path, "checkpoint_2026-12-01_10-00-00.000000", {"model.pt": b"m"})
    seal(d, [hash_directory(d, 0)], world_size=1, step=5)
    assert scan(tmp_path).chosen.name == "checkpoint_000001"
    assert scan(tmp_path, reported=True).chosen == d
    assert [c.path for c in candidates_of(tmp_path, reported=True)] == [d]
    doc = json.loads((d / MANIFEST_NAME).read_text())
    assert doc["format"] == "rayguard-checkpoint" and doc["step"] == 5
