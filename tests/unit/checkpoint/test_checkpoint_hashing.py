"""The chunked digest is the same however the bytes arrive, and matches the documented schemes
(sha256, the one every older checkpoint uses, and BLAKE3, the default for new ones)."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.checkpoint import schemes
from rayguard.checkpoint.file_digests import hash_files
from rayguard.checkpoint.hashing import StreamHasher, WriteHasher, combine, digest_bytes

CHUNK = 1000  # small chunks so the properties exercise many boundaries


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_stream_digest_is_independent_of_how_bytes_are_split(data: bytes, cuts: list[int]) -> None:
    points = sorted({0, len(data), *[c for c in cuts if c <= len(data)]})
    with ThreadPoolExecutor(3) as pool:
        hasher = StreamHasher(pool, chunk_size=CHUNK, scheme=schemes.SHA256)
        for a, b in zip(points, points[1:], strict=False):
            hasher.add(memoryview(data)[a:b])
        digest, chunks = hasher.finish()
    expected_chunks = [hashlib.sha256(data[i : i + CHUNK]).digest() for i in range(0, len(data), CHUNK)]
    assert chunks == tuple(c.hex() for c in expected_chunks)
    assert digest == hashlib.sha256(b"".join(expected_chunks)).hexdigest() == combine(expected_chunks,
                                                                                 schemes.SHA256)


def test_empty_file_digest_is_sha256_of_nothing() -> None:
    assert digest_bytes(b"", scheme=schemes.SHA256) == (hashlib.sha256(b"").hexdigest(), ())
    assert digest_bytes(b"", scheme=schemes.BLAKE3) == (blake3.blake3(b"").hexdigest(), ())


def test_hash_files_matches_in_memory_digest_and_reports_missing(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(os.urandom(3500))
    b.write_bytes(b"")
    out = hash_files([a, b, tmp_path / "missing"], chunk_size=CHUNK, scheme=schemes.SHA256)
    assert out[0] == digest_bytes_with(a.read_bytes(), CHUNK)
    assert out[1] == (hashlib.sha256(b"").hexdigest(), ())
    assert isinstance(out[2], OSError)


def digest_bytes_with(data: bytes, chunk: int) -> tuple[str, tuple[str, ...]]:
    chunks = [hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk)]
    return combine(chunks, schemes.SHA256), tuple(c.hex() for c in chunks)


def _blake3_reference(data: bytes, chunk: int) -> tuple[str, tuple[str, ...]]:
    chunks = [blake3.blake3(data[i : i + chunk]).digest() for i in range(0, len(data), chunk)]
    return blake3.blake3(b"".join(chunks)).hexdigest(), tuple(c.hex() for c in chunks)


def test_blake3_scheme_is_blake3_over_chunks_on_every_path(tmp_path: Path) -> None:
    """Writing (stream and write-call hashers), re-reading a file and the in-memory reference
    give the documented BLAKE3 digest, which differs from sha256's."""
    data = os.urandom(3500)
    want = _blake3_reference(data, CHUNK)
    (tmp_path / "f").write_bytes(data)
    assert digest_bytes(data, CHUNK, scheme=schemes.BLAKE3) == want
    assert hash_files([tmp_path / "f"], chunk_size=CHUNK, scheme=schemes.BLAKE3)[0] == want
    with ThreadPoolExecutor(2) as pool:
        stream = StreamHasher(pool, chunk_size=CHUNK, scheme=schemes.BLAKE3)
        stream.add(memoryview(data)[:1234])
        stream.add(memoryview(data)[1234:])
        assert stream.finish() == want
        writes = WriteHasher(pool, chunk_size=CHUNK, scheme=schemes.BLAKE3)
        for a in range(0, len(data), 700):
            writes.around(memoryview(data)[a : a + 700], lambda: 0)
        assert writes.finish() == want
    assert want != digest_bytes(data, CHUNK, scheme=schemes.SHA256)


def test_new_checkpoints_default_to_blake3_and_selection_is_per_process() -> None:
    assert schemes.DEFAULT == schemes.BLAKE3  # measured ~4x sha256 per core (docs/checkpointing.md)
    before = schemes.current()
    try:
        schemes.select(schemes.SHA256)
        assert digest_bytes(b"x") == digest_bytes(b"x", scheme=schemes.SHA256)
        with pytest.raises(ValueError, match="unknown hash scheme 'md5'"):
            schemes.select("md5")
        assert schemes.current() == schemes.SHA256
    finally:
        schemes.select(before)
