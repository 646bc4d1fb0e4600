"""What someone with write access to a run directory can do: replace a checkpoint file and
rewrite its manifest entry to match (in the manifest's scheme), so the digest check passes.

Used by the tests that show what rayguard does and does not trust (see the security section
of docs/checkpointing.md): the manifest proves a checkpoint is whole, not who wrote it.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

from rayguard.checkpoint.hashing import digest_bytes
from rayguard.checkpoint.manifest import MANIFEST_NAME


def flip_byte(path: str | os.PathLike[str], offset: int | None = None,
              mask: int = 0xFF) -> None:
    """Silent corruption (bit rot, not a forgery): the byte at ``offset`` of ``path`` (its
    middle when ``None``; counted from the end when negative, as an index is) XOR ``mask``;
    the size does not change."""
    with open(path, "r+b") as f:
        if offset is None or offset < 0:
            size = f.seek(0, os.SEEK_END)
            offset = size // 2 if offset is None else size + offset
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))


def forge_file(checkpoint_dir: str | os.PathLike[str], rel_path: str, data: bytes) -> None:
    """Write ``data`` as ``rel_path`` of the checkpoint and make its manifest entry match."""
    root = Path(checkpoint_dir)
    (root / rel_path).write_bytes(data)
    manifest = root / MANIFEST_NAME
    doc = json.loads(manifest.read_text(encoding="utf-8"))
    digest, chunks = digest_bytes(data, scheme=doc["hash"])
    for entry in doc["files"]:
        if entry["path"] == rel_path:
            entry.update(size_bytes=len(data), digest=digest, chunk_digests=list(chunks))
            break
    else:
        raise KeyError(f"{rel_path} is not in {manifest}")
    manifest.write_text(json.dumps(doc, indent=1), encoding="utf-8")


class RunsCommand:
    """Unpickling this runs ``os.system(command)`` (it pickles as ``posix.system``)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def command_pickle(command: str) -> bytes:
    """A pickle that runs ``command`` in a shell when it is loaded without restriction."""
    return pickle.dumps(RunsCommand(command))
