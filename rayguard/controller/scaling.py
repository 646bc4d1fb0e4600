"""Ray Train's elastic scaling, restricted to the world sizes that keep the global batch exact.

Ray's ``ElasticScalingPolicy`` (``ScalingConfig(num_workers=(min, max))``) turns the
resources reserved for the run into a worker count both when (re)starting a worker group
and when watching a running one. :class:`ValidSizeElasticPolicy` rounds that count down to
the largest valid size (the pure :func:`~rayguard.elastic.geometry.largest_valid_at_most`),
so Ray never starts an invalid world: below the smallest valid size it waits
(``NoopDecision``) exactly as Ray does below ``min_workers``, and a running group is not
restarted for a change that rounds to its current size.

It also asks the coordinator for a *fresh* view of the cluster after a failure (Ray 2.60's
``recompute=True``; on 2.59 the plain view). Ray's autoscaling coordinator refreshes its
view only every 20 s, so after a node loss plain Ray tries to restart at the old size and
waits out the worker-group start-up timeout (60 s) before it retries smaller; measured in
``tests/benchmarks/bench_elastic.py``. Both overrides of Ray's private methods live in
:class:`rayguard._ray.train.RoundingElasticPolicy`.

A trainer hands the policy to Ray's controller through
:meth:`rayguard._ray.train.GuardHooksTrainer.controller_policies` (see
:func:`make_scaling_policy`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from rayguard._ray.train import RoundingElasticPolicy, ScalingPolicy, create_scaling_policy
from rayguard.controller.fence import FencedFixedPolicy, FenceView
from rayguard.elastic.geometry import largest_valid_at_most, valid_world_sizes
from rayguard.exceptions import ConfigError

if TYPE_CHECKING:
    from ray.train.v2.api.config import ScalingConfig

    from rayguard.config import GuardConfig

logger = logging.getLogger(__name__)


class _RoundDown:
    """``possible -> the largest valid size <= possible`` (0: none), logging each new rounding."""

    def __init__(self, valid_sizes: list[int]) -> None:
        self.valid_sizes = valid_sizes
        self.last: tuple[int, int] | None = None

    def __call__(self, possible: int) -> int:
        chosen = largest_valid_at_most(possible, self.valid_sizes)
        if chosen != possible and (possible, chosen) != self.last:  # log changes only
            self.last = (possible, chosen)
            logger.info("rayguard: resources for %d workers; using %d, the largest world size that "
                        "keeps the global batch exact (valid: %s)", possible, chosen, self.valid_sizes)
        return chosen


class ValidSizeElasticPolicy(RoundingElasticPolicy):
    """Ray's elastic policy that only ever chooses a size from ``valid_sizes``."""

    def __init__(self, scaling_config: ScalingConfig, valid_sizes: Sequence[int],
                 fresh_cluster_view: bool = True,
                 excluded: Callable[[], Collection[str]] | None = None) -> None:
        self.valid_sizes = sorted(set(valid_sizes))
        """Allowed world sizes, ascending (from :func:`valid_world_sizes`)."""
        super().__init__(scaling_config, _RoundDown(self.valid_sizes), fresh_cluster_view,
                         excluded)


def any_size(possible: int) -> int:
    """Every world size Ray's elastic policy would choose is fine (no batch geometry)."""
    return possible


def valid_sizes_for(scaling_config: ScalingConfig, global_batch_size: int, micro_batch_size: int) -> list[int]:
    """Valid world sizes within the scaling config's ``[min_workers, max_workers]``.

    Raises :class:`ConfigError` when there is none (or, for a fixed size, when that size is
    not valid), listing the sizes that would work.
    """
    lo, hi = max(1, scaling_config.min_workers), max(1, scaling_config.max_workers)
    valid = valid_world_sizes(global_batch_size, micro_batch_size, lo, hi)
    if valid:
        return valid
    anywhere = valid_world_sizes(global_batch_size, micro_batch_size, 1, max(hi, global_batch_size))
    field = "num_workers"
    value = (lo, hi) if scaling_config.elasticity_enabled else hi
    raise ConfigError(
        f"ScalingConfig({field}={value!r}): no world size in [{lo}, {hi}] keeps "
        f"global_batch_size={global_batch_size} = micro_batch_size={micro_batch_size} x "
        f"grad_accum_steps x world_size; valid world sizes: {anywhere}. Fix: choose num_workers "
        "among those (or a range containing one), or change the batch sizes")


def make_scaling_policy(scaling_config: ScalingConfig, valid_sizes: Sequence[int] | GuardConfig,
                        fence: FenceView | None = None, run_dir: str = "RUN_DIR") -> ScalingPolicy:
    """The scaling policy a rayguard trainer hands to Ray's controller.

    ``valid_sizes``: the allowed world sizes, or a :class:`GuardConfig` with the batch
    geometry (they are then computed with :func:`valid_sizes_for`). Elastic config: a
    :class:`ValidSizeElasticPolicy`. Fixed config: Ray's own policy, after checking that
    ``num_workers`` is valid (else :class:`ConfigError` listing the valid sizes).
    ``fence``: the quarantined nodes, which the policy does not count (a fixed-size run
    that no longer fits on the others waits: :class:`FencedFixedPolicy`).
    """
    if not isinstance(valid_sizes, Sequence):
        g, m = valid_sizes.global_batch_size, valid_sizes.micro_batch_size
        if g is None or m is None:
            return _without_geometry(scaling_config, fence, run_dir)
        valid_sizes = valid_sizes_for(scaling_config, g, m)
    if not valid_sizes:
        raise ConfigError("make_scaling_policy(valid_sizes=[]): no valid world size. "
                          "Fix: compute them with rayguard.elastic.valid_sizes_for(...)")
    if not scaling_config.elasticity_enabled:
        if scaling_config.num_workers not in valid_sizes:
            raise ConfigError(
                f"ScalingConfig(num_workers={scaling_config.num_workers}): this world size breaks "
                f"the global batch; valid world sizes: {sorted(valid_sizes)}. Fix: pick one of them")
        return _without_geometry(scaling_config, fence, run_dir)
    return ValidSizeElasticPolicy(scaling_config, valid_sizes, excluded=fence)


def _without_geometry(scaling_config: ScalingConfig, fence: FenceView | None,
                      run_dir: str) -> ScalingPolicy:
    if fence is None:
        return create_scaling_policy(scaling_config)
    if scaling_config.elasticity_enabled:
        return RoundingElasticPolicy(scaling_config, any_size, excluded=fence)
    return FencedFixedPolicy(scaling_config, fence, run_dir)
