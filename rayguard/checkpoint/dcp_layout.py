"""Where torch.distributed.checkpoint's files lie inside a rayguard checkpoint, and who wrote
each: names only (no I/O, no torch), shared by the verifier, the safe DCP reader and the
sharded-part planner (:mod:`rayguard.checkpoint.sharded`)."""

from __future__ import annotations

import re
from collections.abc import Iterable

DCP_DIR = "dcp"
"""Where DCP writes, relative to the checkpoint directory."""
DCP_METADATA = ".metadata"
SHARDED_KEY = "sharded"
"""The key of the sharded part's description in ``Manifest.metadata``."""
SHARDED_FORMAT = "torch.distributed.checkpoint"

_DATA_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def owner_of(name: str) -> int | None:
    """The rank that wrote DCP file ``name`` (``.metadata``: rank 0); None for a stranger."""
    if name == DCP_METADATA:
        return 0
    match = _DATA_FILE.match(name)
    return int(match.group(1)) if match else None


def files_of_rank(names: Iterable[str], rank: int) -> list[str]:
    """The DCP files among ``names`` that ``rank`` wrote (and therefore hashes), sorted."""
    return sorted(n for n in names if owner_of(n) == rank)
