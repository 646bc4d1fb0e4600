"""Batch geometry: which world sizes keep the global batch exact, and the accumulation for each.

The invariant rayguard keeps across resizes::

    global_batch_size == micro_batch_size * grad_accum_steps * world_size

``global_batch_size`` and ``micro_batch_size`` are fixed by the user; ``world_size`` is what
the cluster gives; ``grad_accum_steps`` absorbs the difference. A world size for which no
integer accumulation exists is *invalid* and is never used (see :mod:`rayguard.controller.scaling`).

Everything here is pure arithmetic over ints.
"""

from __future__ import annotations

import math
from typing import Literal

from rayguard.exceptions import ConfigError, config_error

LrRule = Literal["none", "linear", "sqrt"]


def _check_positive_int(owner: str, name: str, value: object) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise config_error(owner, name, value, "must be an int > 0", f"pass e.g. {name}=8")
    return value


def valid_world_sizes(
    global_batch_size: int, micro_batch_size: int, min_workers: int, max_workers: int
) -> list[int]:
    """World sizes ``w`` in ``[min_workers, max_workers]`` with ``global % (micro * w) == 0``.

    Ascending. Empty when no size in the range keeps the global batch exact.

    >>> valid_world_sizes(64, 4, 1, 8)
    [1, 2, 4, 8]
    """
    owner = "valid_world_sizes"
    _check_positive_int(owner, "global_batch_size", global_batch_size)
    _check_positive_int(owner, "micro_batch_size", micro_batch_size)
    _check_positive_int(owner, "min_workers", min_workers)
    _check_positive_int(owner, "max_workers", max_workers)
    if min_workers > max_workers:
        raise config_error(owner, "min_workers", min_workers, f"must be <= max_workers={max_workers}",
                           "pass a range with min_workers <= max_workers")
    if global_batch_size % micro_batch_size:
        return []
    micro_batches = global_batch_size // micro_batch_size
    # Divisors of the number of micro-batches per step, by trial up to its square root:
    # O(sqrt(global/micro)) rather than O(max_workers).
    divisors: set[int] = set()
    for d in range(1, math.isqrt(micro_batches) + 1):
        if micro_batches % d == 0:
            divisors.update((d, micro_batches // d))
    return sorted(w for w in divisors if min_workers <= w <= max_workers)


def grad_accum_steps(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Micro-batches each rank accumulates per optimizer step at ``world_size``.

    Raises :class:`ConfigError` listing every valid world size when ``global_batch_size`` is
    not ``micro_batch_size * accum * world_size`` for an integer ``accum``.
    """
    owner = "grad_accum_steps"
    _check_positive_int(owner, "global_batch_size", global_batch_size)
    _check_positive_int(owner, "micro_batch_size", micro_batch_size)
    _check_positive_int(owner, "world_size", world_size)
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step == 0:
        return global_batch_size // per_step
    valid = valid_world_sizes(global_batch_size, micro_batch_size, 1, global_batch_size)
    why = (f"global_batch_size={global_batch_size} is not micro_batch_size={micro_batch_size} "
           f"x grad_accum_steps x world_size={world_size} for any integer grad_accum_steps; "
           f"valid world sizes: {valid or 'none (global_batch_size is not a multiple of micro_batch_size)'}")
    raise ConfigError(
        f"{owner}(world_size={world_size}): {why}. Fix: run with one of the valid world sizes "
        "(rayguard's elastic scaling only picks those), or change global_batch_size/micro_batch_size"
    )


def check_world_size(
    global_batch_size: int, micro_batch_size: int, world_size: int, *, where: str = ""
) -> int:
    """Fail an attempt whose world size breaks the batch geometry; return the accumulation.

    The fallback when Ray's scaling cannot be steered: call at worker start-up. ``where``
    (e.g. ``"rank 3 on node abc"``) is added to the message.
    """
    try:
        return grad_accum_steps(global_batch_size, micro_batch_size, world_size)
    except ConfigError as e:
        raise ConfigError(f"{e.args[0]}{' (' + where + ')' if where else ''}") from None


def scaled_lr(base_lr: float, base_world_size: int, world_size: int, rule: LrRule = "none") -> float:
    """Learning rate at ``world_size`` for a run tuned at ``base_world_size``.

    ``"none"`` (the default) keeps ``base_lr``: rayguard keeps the global batch constant, so
    the optimisation does not see the resize. ``"linear"`` scales by
    ``world_size / base_world_size``, ``"sqrt"`` by its square root; use them only when
    the per-rank batch (not the global one) is what is held fixed.
    """
    owner = "scaled_lr"
    _check_positive_int(owner, "base_world_size", base_world_size)
    _check_positive_int(owner, "world_size", world_size)
    if not (isinstance(base_lr, (int, float)) and not isinstance(base_lr, bool)
            and math.isfinite(base_lr) and base_lr >= 0):
        raise config_error(owner, "base_lr", base_lr, "must be a finite float >= 0", "pass e.g. base_lr=1e-3")
    ratio = world_size / base_world_size
    if rule == "none":
        return float(base_lr)
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise config_error(owner, "rule", rule, 'must be "none", "linear" or "sqrt"', 'pass rule="none"')


def largest_valid_at_most(num_workers: int, valid_sizes: list[int]) -> int:
    """The largest valid size ``<= num_workers``; 0 when there is none (wait for more)."""
    best = 0
    for w in valid_sizes:
        if w <= num_workers:
            best = max(best, w)
    return best
