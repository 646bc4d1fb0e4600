"""The digest schemes a manifest may name, and which one new checkpoints use.

Both schemes cut a file into consecutive ``CHUNK_SIZE_BYTES`` chunks (the last one shorter),
digest each chunk, and digest the concatenated raw 32-byte chunk digests into the file
digest (an empty file: the digest of ``b""``). They differ only in the function:

* ``"sha256-chunked-16MiB"``: hashlib's sha256 (every checkpoint written before 0.2 uses it;
  for users who need a FIPS-approved function);
* ``"blake3-chunked-16MiB"``: BLAKE3 (the ``blake3`` package), about 4x sha256's speed per
  core here (6-7 GiB/s against 1.7-1.9 GiB/s), the default for new checkpoints.

Readers accept both, by the name in the manifest; a name this version does not know is
refused with a CheckpointCorruptError that says so. The scheme new checkpoints use is the
process's selection (:func:`select`, set by the worker's checkpointer from
``CheckpointConfig(hash=...)``); every writer also takes an explicit ``scheme=``.
Both functions release the GIL on large buffers, so chunks hash in parallel threads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

from rayguard import runtime

CHUNK_SIZE_BYTES = 16 * 1024 * 1024
SHA256 = "sha256-chunked-16MiB"
BLAKE3 = "blake3-chunked-16MiB"
CONFIG_NAMES = {"sha256": SHA256, "blake3": BLAKE3}
"""``CheckpointConfig(hash=...)`` values -> the scheme names manifests carry."""


class Hasher(Protocol):
    def update(self, data: Any, /) -> Any: ...
    def digest(self) -> bytes: ...


def _blake3() -> Hasher:
    import blake3  # a dependency; imported here so that sha256-only readers never need it

    return blake3.blake3()  # type: ignore[no-any-return]


_FACTORIES: dict[str, Callable[[], Hasher]] = {SHA256: hashlib.sha256, BLAKE3: _blake3}
KNOWN = tuple(_FACTORIES)


def factory(scheme: str) -> Callable[[], Hasher]:
    """A function returning a fresh hasher of ``scheme`` (a name :data:`KNOWN` holds)."""
    try:
        new = _FACTORIES[scheme]
    except KeyError:
        raise ValueError(f"unknown hash scheme {scheme!r}; known: {list(KNOWN)}") from None
    if new is _blake3:  # the package's own constructor once it imports: no import per file
        import blake3

        return blake3.blake3  # type: ignore[no-any-return]
    return new


def short_name(scheme: str) -> str:
    """The function's name in messages (``sha256``, ``blake3``)."""
    return scheme.split("-", 1)[0]


def _available(scheme: str) -> bool:
    try:
        factory(scheme)()
    except ImportError:
        return False
    return True


DEFAULT = BLAKE3 if _available(BLAKE3) else SHA256
"""New checkpoints' scheme unless configured: BLAKE3 (measured faster), sha256 without the
``blake3`` package."""


def select(scheme: str) -> None:
    """Make ``scheme`` (a name in :data:`KNOWN`) the one this worker's new checkpoints use
    (its :mod:`rayguard.runtime`'s; a process that runs no worker: its default runtime)."""
    factory(scheme)()  # fails now, not at the first checkpoint, when it cannot be used
    runtime.current().hash_scheme = scheme


def current() -> str:
    """The scheme this worker's new checkpoints use."""
    return runtime.current().hash_scheme or DEFAULT
