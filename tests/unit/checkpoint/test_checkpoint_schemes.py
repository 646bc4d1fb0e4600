"""Digest schemes: new checkpoints use the selected one, readers accept sha256 and BLAKE3
side by side, an unknown scheme is refused by name, and the config knob is validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rayguard.checkpoint import read_manifest, scan, schemes, verify
from rayguard.checkpoint.commit import commit, staging_dir_for
from rayguard.checkpoint.hashing import digest_bytes
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.reader import read_shard
from rayguard.checkpoint.writer import write_shard
from rayguard.config import CheckpointConfig
from rayguard.exceptions import CheckpointCorruptError, CheckpointError, ConfigError
from rayguard.testing.forge import flip_byte


def _save(root: Path, step: int, scheme: str | None) -> Path:
    final = root / f"checkpoint_{step:06d}"
    staging = staging_dir_for(final)
    record = write_shard(staging, 0, {"step": step, "w": torch.full((1000,), float(step))},
                         scheme=scheme)
    return commit(staging, final, [record], world_size=1, step=step)


def _manifest_doc(ckpt: Path) -> dict:
    return json.loads((ckpt / MANIFEST_NAME).read_text(encoding="utf-8"))


@pytest.mark.parametrize("scheme", [schemes.SHA256, schemes.BLAKE3])
def test_the_manifest_names_the_scheme_its_digests_are_in(tmp_path: Path, scheme: str) -> None:
    ckpt = _save(tmp_path, 1, scheme)
    doc = _manifest_doc(ckpt)
    assert doc["hash"] == scheme and "scheme" not in doc["files"][0]
    manifest = read_manifest(ckpt)
    assert manifest.hash_scheme == scheme and {f.scheme for f in manifest.files} == {scheme}
    for f in manifest.files:
        assert digest_bytes((ckpt / f.path).read_bytes(), scheme=scheme) == (f.digest, f.chunk_digests)
    assert verify(ckpt).ok and read_shard(ckpt, 0)["step"] == 1


def test_default_scheme_is_blake3_for_new_checkpoints(tmp_path: Path) -> None:
    assert schemes.current() == schemes.BLAKE3
    assert _manifest_doc(_save(tmp_path, 1, None))["hash"] == schemes.BLAKE3


def test_sha256_and_blake3_checkpoints_verify_side_by_side_and_fall_back(tmp_path: Path) -> None:
    """A run directory written before the switch (sha256) and after it (BLAKE3): both verify,
    and a corrupt BLAKE3 checkpoint falls back to the sha256 one."""
    old = _save(tmp_path, 1, schemes.SHA256)
    new = _save(tmp_path, 2, schemes.BLAKE3)
    assert verify(old).ok and verify(new).ok
    assert scan(tmp_path).chosen == new
    shard = new / "shard-rank00000.safetensors"
    flip_byte(shard, -10)
    result = scan(tmp_path)
    assert result.chosen == old and read_shard(old, 0)["step"] == 1
    assert "blake3 mismatch in bytes" in result.rejected[0].problems[0].what
    with pytest.raises(CheckpointCorruptError, match="blake3 mismatch"):
        read_shard(new, 0)


def test_a_sha256_digest_under_a_blake3_name_does_not_verify(tmp_path: Path) -> None:
    """The scheme is bound to the digests: relabelling a manifest is caught."""
    ckpt = _save(tmp_path, 1, schemes.SHA256)
    doc = _manifest_doc(ckpt)
    doc["hash"] = schemes.BLAKE3
    (ckpt / MANIFEST_NAME).write_text(json.dumps(doc), encoding="utf-8")
    assert not verify(ckpt).ok
    with pytest.raises(CheckpointCorruptError, match="blake3 mismatch"):
        read_shard(ckpt, 0)


def test_an_unknown_scheme_is_refused_by_name_and_an_older_checkpoint_chosen(tmp_path: Path) -> None:
    old = _save(tmp_path, 1, None)
    new = _save(tmp_path, 2, None)
    doc = _manifest_doc(new)
    doc["hash"] = "md5-chunked-16MiB"
    (new / MANIFEST_NAME).write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(CheckpointCorruptError,
                       match=r"hash scheme 'md5-chunked-16MiB', which this rayguard cannot verify "
                             r"\(it knows sha256-chunked-16MiB, blake3-chunked-16MiB\).*upgrade"):
        read_manifest(new)
    report = verify(new)
    assert not report.ok and "md5-chunked-16MiB" in report.describe()
    assert scan(tmp_path).chosen == old


def test_files_hashed_with_different_schemes_cannot_share_a_manifest(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_000001"
    staging = staging_dir_for(final)
    records = [write_shard(staging, 0, {"r": 0}, scheme=schemes.SHA256),
               write_shard(staging, 1, {"r": 1}, scheme=schemes.BLAKE3)]
    with pytest.raises(CheckpointError, match="different schemes.*CheckpointConfig\\(hash=...\\)"):
        commit(staging, final, records, world_size=2, step=1)
    assert not (final / MANIFEST_NAME).exists()


def test_config_hash_is_validated_and_maps_to_a_scheme() -> None:
    assert CheckpointConfig().hash == "blake3"
    assert schemes.CONFIG_NAMES[CheckpointConfig(hash="sha256").hash] == schemes.SHA256
    with pytest.raises(ConfigError, match=r"CheckpointConfig\(hash='md5'\): must be \"blake3\" or "
                                          r"\"sha256\". Fix: pass hash=\"blake3\""):
        CheckpointConfig(hash="md5")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"CheckpointConfig\(hash='SHA256'\)"):
        CheckpointConfig(hash="SHA256")  # type: ignore[arg-type]
