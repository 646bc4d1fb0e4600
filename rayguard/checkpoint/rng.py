"""Capture and restore every global RNG (python, numpy, torch CPU, CUDA) as checkpointable data.

The captured dict holds only tensors, ints, floats, strings and None, so it is saved in a
shard like any other state (no pickle). rayguard stores it under the reserved key
``RNG_STATE_KEY`` of each shard.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

logger = logging.getLogger("rayguard.checkpoint")

RNG_STATE_KEY = "__rayguard_rng__"


def capture_rng_state() -> dict[str, Any]:
    """The state of python's ``random``, numpy's global RNG, torch CPU and (if used) CUDA."""
    version, internal, gauss_next = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": str(np_kind),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.uint32).astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": None,
    }
    # Only when CUDA is already in use: querying it would otherwise create a context.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured (CUDA only where devices exist)."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    nps = state["numpy"]
    keys = nps["keys"].numpy().astype(np.uint32)
    np.random.set_state((nps["kind"], keys, nps["pos"], nps["has_gauss"], nps["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if count != len(cuda):
            logger.warning(
                "rayguard: checkpoint holds CUDA RNG states for %d devices, this process sees %d; "
                "restoring the first %d",
                len(cuda),
                count,
                min(count, len(cuda)),
            )
        for device, s in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(s, device)
