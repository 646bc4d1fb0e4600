"""Ray Train's elastic scaling, restricted to the world sizes that keep the global batch exact.

Ray 2.60's ``ElasticScalingPolicy`` (``ScalingConfig(num_workers=(min, max))``) turns the
resources reserved for the run into a worker count (``_count_possible_workers``) both when
(re)starting a worker group and when watching a running one. :class:`ValidSizeElasticPolicy`
rounds that count down to the largest valid size, so Ray never starts an invalid world:
below the smallest valid size it waits (``NoopDecision``) exactly as Ray does below
``min_workers``, and a running group is not restarted for a change that rounds to its
current size.

It also asks the coordinator for a *fresh* view of the cluster (``recompute=True``). Ray's
``_AutoscalingCoordinatorActor`` refreshes its view only every 20 s, so after a node loss
plain Ray tries to restart at the old size and waits out the worker-group start-up timeout
(60 s) before it retries smaller; measured in ``tests/benchmarks/bench_elastic.py``.

``DataParallelTrainer.fit()`` builds its policy with ``create_scaling_policy(scaling_config)``
and passes it to ``_initialize_and_run_controller(**kwargs)``; a trainer swaps in ours by
overriding that one method (see :func:`make_scaling_policy`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import ray
from ray.train.v2._internal.execution.scaling_policy import (
    ElasticScalingPolicy,
    ScalingDecision,
    ScalingPolicy,
    create_scaling_policy,
)
from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
    AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
)
from ray.train.v2._internal.execution.worker_group import WorkerGroupPollStatus, WorkerGroupState
from ray.train.v2._internal.util import time_monotonic

from rayguard.elastic.geometry import largest_valid_at_most, valid_world_sizes
from rayguard.exceptions import ConfigError

if TYPE_CHECKING:
    from ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator import ReservedResources
    from ray.train.v2.api.config import ScalingConfig

    from rayguard.config import GuardConfig

logger = logging.getLogger(__name__)


class ValidSizeElasticPolicy(ElasticScalingPolicy):
    """Ray's elastic policy that only ever chooses a size from ``valid_sizes``."""

    def __init__(self, scaling_config: ScalingConfig, valid_sizes: Sequence[int],
                 fresh_cluster_view: bool = True) -> None:
        super().__init__(scaling_config)
        self.valid_sizes = sorted(set(valid_sizes))
        """Allowed world sizes, ascending (from :func:`valid_world_sizes`)."""
        self.fresh_cluster_view = fresh_cluster_view
        """Ask the coordinator to recompute reservations against live nodes on each query."""
        self._last_rounding: tuple[int, int] | None = None
        self._was_running = False

    def make_decision_for_running_worker_group(self, worker_group_state: WorkerGroupState,
                                               worker_group_status: WorkerGroupPollStatus) -> ScalingDecision:
        self._was_running = True
        return super().make_decision_for_running_worker_group(worker_group_state, worker_group_status)

    def make_decision_for_non_running_worker_group(self) -> ScalingDecision:
        if self._was_running and self.fresh_cluster_view:
            # The group just failed or is being resized: the reservation cached by the running
            # group's monitor (up to 1 s old) still counts a node that may have just died.
            self._was_running = False
            self._latest_reserved_resources_query_time = float("-inf")
        return super().make_decision_for_non_running_worker_group()

    def _count_possible_workers(self, reserved_resources: ReservedResources) -> int:
        possible = super()._count_possible_workers(reserved_resources)
        chosen = largest_valid_at_most(possible, self.valid_sizes)
        if chosen != possible and (possible, chosen) != self._last_rounding:  # log changes only
            self._last_rounding = (possible, chosen)
            logger.info("rayguard: resources for %d workers; using %d, the largest world size that "
                        "keeps the global batch exact (valid: %s)", possible, chosen, self.valid_sizes)
        return chosen

    def _get_reserved_resources(self) -> ReservedResources | None:
        if not self.fresh_cluster_view:
            return super()._get_reserved_resources()
        now = time_monotonic()
        if now - self._latest_reserved_resources_query_time < self.GET_RESERVED_RESOURCES_INTERVAL_S:
            return self._latest_reserved_resources
        coordinator = self._autoscaling_coordinator
        reserved = None
        try:
            reserved = ray.get(
                coordinator.get_reserved_resources.remote(self._requester_id, recompute=True),
                timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S)
        except TypeError:  # a Ray without ``recompute``: the plain query
            self.fresh_cluster_view = False
            return super()._get_reserved_resources()
        except Exception:
            logger.warning("rayguard: failed to get reserved resources for %s; not resizing now",
                           self._requester_id, exc_info=True)
        finally:
            self._latest_reserved_resources_query_time = time_monotonic()
        self._latest_reserved_resources = reserved
        return reserved


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


def make_scaling_policy(scaling_config: ScalingConfig, valid_sizes: Sequence[int] | GuardConfig) -> ScalingPolicy:
    """The scaling policy a rayguard trainer hands to Ray's controller.

    ``valid_sizes``: the allowed world sizes, or a :class:`GuardConfig` with the batch
    geometry (they are then computed with :func:`valid_sizes_for`). Elastic config: a
    :class:`ValidSizeElasticPolicy`. Fixed config: Ray's own policy, after checking that
    ``num_workers`` is valid (else :class:`ConfigError` listing the valid sizes).
    """
    if not isinstance(valid_sizes, Sequence):
        g, m = valid_sizes.global_batch_size, valid_sizes.micro_batch_size
        if g is None or m is None:
            return create_scaling_policy(scaling_config)
        valid_sizes = valid_sizes_for(scaling_config, g, m)
    if not valid_sizes:
        raise ConfigError("make_scaling_policy(valid_sizes=[]): no valid world size. "
                          "Fix: compute them with rayguard.elastic.valid_sizes_for(...)")
    if not scaling_config.elasticity_enabled:
        if scaling_config.num_workers not in valid_sizes:
            raise ConfigError(
                f"ScalingConfig(num_workers={scaling_config.num_workers}): this world size breaks "
                f"the global batch; valid world sizes: {sorted(valid_sizes)}. Fix: pick one of them")
        return create_scaling_policy(scaling_config)
    return ValidSizeElasticPolicy(scaling_config, valid_sizes)
