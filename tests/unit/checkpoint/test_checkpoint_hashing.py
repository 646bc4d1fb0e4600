"""The chunked digest is the same however the bytes arrive, and matches the documented scheme."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.checkpoint.hashing import StreamHasher, combine, digest_bytes, hash_files

CHUNK = 1000  # small chunks so the properties exercise many boundaries


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_stream_digest_is_independent_of_how_bytes_are_split(data: bytes, cuts: list[int]) -> None:
    points = sorted({0, len(data), *[c for c in cuts if c <= len(data)]})
    with ThreadPoolExecutor(3) as pool:
        hasher = StreamHasher(pool, chunk_size=CHUNK)
        for a, b in zip(points, points[1:], strict=False):
            hasher.add(memoryview(data)[a:b])
        digest, chunks = hasher.finish()
    expected_chunks = [hashlib.sha256(data[i : i + CHUNK]).digest() for i in range(0, len(data), CHUNK)]
    assert chunks == tuple(c.hex() for c in expected_chunks)
    assert digest == hashlib.sha256(b"".join(expected_chunks)).hexdigest() == combine(expected_chunks)


def test_empty_file_digest_is_sha256_of_nothing() -> None:
    assert digest_bytes(b"") == (hashlib.sha256(b"").hexdigest(), ())


def test_hash_files_matches_in_memory_digest_and_reports_missing(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(os.urandom(3500))
    b.write_bytes(b"")
    out = hash_files([a, b, tmp_path / "missing"], chunk_size=CHUNK)
    assert out[0] == digest_bytes_with(a.read_bytes(), CHUNK)
    assert out[1] == (hashlib.sha256(b"").hexdigest(), ())
    assert isinstance(out[2], OSError)


def digest_bytes_with(data: bytes, chunk: int) -> tuple[str, tuple[str, ...]]:
    chunks = [hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk)]
    return combine(chunks), tuple(c.hex() for c in chunks)
