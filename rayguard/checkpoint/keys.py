"""State-dict key normalisation across wrappers (DDP ``module.``, torch.compile ``_orig_mod.``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rayguard.exceptions import CheckpointError

WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def strip_wrapper_prefixes(key: str) -> str:
    """``module._orig_mod.fc.weight`` -> ``fc.weight``."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def normalize_state_dict_keys(
    state_dict: Mapping[str, Any], like: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Rename ``state_dict``'s keys to match ``like``'s wrapper prefixes.

    A state saved from ``DistributedDataParallel(model)`` (keys ``module.x``) loads into
    ``model`` (keys ``x``) and vice versa: pass ``like=target_model.state_dict()``. Without
    ``like`` the wrapper prefixes are stripped. Keys with no counterpart in ``like`` are kept
    unchanged, so ``load_state_dict(strict=True)`` still reports them.
    """
    target: dict[str, str] = {}
    if like is not None:
        for key in like:
            target.setdefault(strip_wrapper_prefixes(key), key)
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        if like is not None and key in like:
            new = key
        else:
            bare = strip_wrapper_prefixes(key)
            new = target.get(bare, key if like is not None else bare)
        if new in out:
            raise CheckpointError(
                f"normalize_state_dict_keys: keys {key!r} and another both map to {new!r}. "
                "Fix: the state mixes wrapped and unwrapped copies of a module; save one."
            )
        out[new] = value
    return out
