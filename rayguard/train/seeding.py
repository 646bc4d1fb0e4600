"""Per-rank seeding: a distinct, reproducible seed for every rank."""

from __future__ import annotations

import os
import random

_GOLDEN = 0x9E3779B1  # odd, so (base + rank * _GOLDEN) mod 2**32 is distinct for every rank


def rank_seed(base: int, rank: int) -> int:
    """The seed of ``rank`` for base seed ``base``: distinct across ranks, in [0, 2**32)."""
    return (base + rank * _GOLDEN) % 2**32


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` (all CUDA devices too)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device as well
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
