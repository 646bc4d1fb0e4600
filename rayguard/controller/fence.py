"""The quarantine as Ray Train's controller applies it: where the next worker group may go.

:class:`FenceView` asks the run's coordinator which nodes are quarantined (it re-reads the
run directory's quarantine file, so a ``rayguard quarantine lift`` takes effect at the next
worker-group start). The scaling policies count only admitted nodes: the elastic one drops
the quarantined nodes' reservations (:class:`rayguard._ray.train.RoundingElasticPolicy`,
``excluded=``), and :class:`FencedFixedPolicy`, for a fixed-size run, waits with a clear
message while the admitted nodes cannot hold the group, instead of failing. The callback
(:mod:`rayguard.controller.callbacks`) adds the exclusion to the group's label selectors
(:func:`rayguard.placement.exclude.exclude_nodes`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rayguard._ray.core import alive_node_resources
from rayguard._ray.train import FixedScalingPolicy, NoopDecision, resources_per_worker
from rayguard.events import make_event
from rayguard.health.quarantine_file import attempts
from rayguard.placement.exclude import workers_that_fit

logger = logging.getLogger("rayguard")

WAIT_POLL_S = 1.0
"""How often a waiting fixed-size run looks at the cluster again."""

WAIT_LOG_INTERVAL_S = 30.0


class FenceView:
    """``() -> frozenset`` of quarantined node ids (from the coordinator, cached ``ttl_s``).
    Pickles (the policies holding it are sent to the controller)."""

    def __init__(self, coordinator: Any, ttl_s: float = 1.0) -> None:
        self.coordinator = coordinator
        self.ttl_s = ttl_s
        self._nodes: frozenset[str] = frozenset()
        self._at = float("-inf")

    def __call__(self, fresh: bool = False) -> frozenset[str]:
        if not fresh and time.monotonic() - self._at < self.ttl_s:
            return self._nodes
        import ray

        try:
            self._nodes = frozenset(ray.get(self.coordinator.excluded_nodes.remote(), timeout=30))
        except Exception as exc:  # keep the last view: placing on a fenced node beats stopping
            logger.warning("rayguard: quarantined nodes unavailable (%s); using the last view", exc)
        self._at = time.monotonic()
        return self._nodes

    def reasons(self) -> dict[str, dict[str, Any]]:
        import ray

        try:
            return dict(ray.get(self.coordinator.quarantined_nodes.remote(), timeout=30))
        except Exception:
            return {n: {} for n in self._nodes}


def wait_message(num_workers: int, room: int, quarantined: dict[str, dict[str, Any]],
                 run_dir: str) -> str:
    """What a fixed-size run that no longer fits says while it waits (entries of any shape:
    what is not a reason or an attempt reads ``?``)."""
    nodes = "; ".join(f"{str(n)[:12]} ({_reason(e)}, attempts "
                      f"{', '.join(map(str, attempts(e))) or '?'})"
                      for n, e in sorted(quarantined.items(), key=lambda item: str(item[0])))
    return (f"{num_workers} worker(s) do not fit on the admitted nodes (room for {room}); "
            f"quarantined: {nodes}. Waiting for capacity: add a node, or lift the quarantine "
            f"with `rayguard quarantine lift {run_dir} NODE` (or --all; it takes effect at the "
            "next worker-group start)")


def _reason(entry: Any) -> str:
    reason = entry.get("reason") if isinstance(entry, dict) else None
    return reason[:64] if isinstance(reason, str) else "?"


class FencedFixedPolicy(FixedScalingPolicy):
    """Ray's fixed-size policy that waits (``NoopDecision``) while the nodes not quarantined
    cannot hold the group: one ``placement_wait`` event (a console line) when the wait
    starts, a log line every 30 s while it lasts."""

    def __init__(self, scaling_config: Any, fence: FenceView, run_dir: str = "RUN_DIR") -> None:
        super().__init__(scaling_config)
        self.fence = fence
        self.run_dir = run_dir
        self._said = float("-inf")
        self._waiting = False

    def make_decision_for_non_running_worker_group(self) -> Any:
        excluded = self.fence(fresh=True)
        if excluded:
            config = self.scaling_config
            wanted = int(config.max_workers)  # a fixed size: num_workers
            room = workers_that_fit(alive_node_resources(), resources_per_worker(config),
                                    excluded)
            if room < wanted:
                self._wait(wanted, room)
                return NoopDecision()
        if self._waiting:
            self._waiting = False
            logger.info("rayguard: the admitted nodes hold the worker group again; starting it")
        return super().make_decision_for_non_running_worker_group()

    def _wait(self, num_workers: int, room: int) -> None:
        now = time.monotonic()
        if not self._waiting or now - self._said >= WAIT_LOG_INTERVAL_S:
            quarantined = self.fence.reasons()
            message = wait_message(num_workers, room, quarantined, self.run_dir)
            logger.warning("rayguard: %s", message)
            if not self._waiting:
                self._record(make_event("placement_wait", message, wanted=num_workers,
                                        room=room, quarantined=sorted(quarantined)))
            self._said = now
        self._waiting = True
        time.sleep(WAIT_POLL_S)  # the controller asks again at once: do not spin

    def _record(self, event: dict[str, Any]) -> None:
        try:
            self.fence.coordinator.record.remote(event)
        except Exception as exc:
            logger.debug("rayguard: could not record the wait: %s", exc)
