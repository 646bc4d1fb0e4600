"""The standalone API: save / load / verify a checkpoint directory, outside Ray."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from rayguard.checkpoint.commit import commit, discard_staging, staging_dir_for
from rayguard.checkpoint.reader import read_shard
from rayguard.checkpoint.writer import write_shard


def save(
    directory: str | os.PathLike[str],
    state: Any,
    *,
    step: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Save ``state`` as a one-shard checkpoint at ``directory``, atomically.

    ``directory`` must not exist (or be empty). Either the whole verified checkpoint appears
    there, or (crash, disk full) nothing does. Returns ``directory``.
    """
    final = Path(directory)
    staging = staging_dir_for(final)
    discard_staging(staging)  # a leftover of an earlier crashed save of the same name
    try:
        record = write_shard(staging, 0, state)
    except BaseException:
        discard_staging(staging)
        raise
    return commit(staging, final, [record], world_size=1, step=step, metadata=metadata)


def load(
    directory: str | os.PathLike[str],
    *,
    rank: int = 0,
    verify: bool = True,
    map_location: str | torch.device | None = None,
) -> Any:
    """Load (and verify while loading) the state saved in ``directory``.

    Raises CheckpointCorruptError naming the file and what is wrong if it does not verify.
    """
    return read_shard(directory, rank, verify=verify, map_location=map_location)
