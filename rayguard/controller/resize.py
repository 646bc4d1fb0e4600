"""Resizing an elastic run in place, in Ray Train's controller (live recovery on
``ScalingConfig(num_workers=(min, max))``).

:class:`rayguard._ray.resize.GuardController` asks :meth:`InPlaceResizer.resize` before Ray
restarts a group for a size change. The plan is pure
(:func:`rayguard.elastic.in_place.plan_resize`); this module carries it out with the run's
coordinator and Ray's worker group, in this order:

1. open the next attempt, whose notice (under :func:`rayguard.health.live.live_key` of the
   running attempt) says ``resize``: every kept worker leaves the running attempt (a
   survivor of a lost node at once, the others at their next report) and marks
   :func:`left_key`;
2. wait (``HealthConfig(live_wait_s)``) until every kept worker has left, resetting Ray's
   report barrier meanwhile (a report of the old size waiting for a lost peer is released);
3. clear the kept workers' result queues and reset the barrier once more: no report of the
   old size reaches the new one;
4. shrink the worker group to the kept workers, or start the new workers at free
   placement-group bundles; write the rank assignment;
5. publish :func:`go_key` with each kept worker's new place (rank, world size, local
   ranks): it takes it and sets up again in its own process
   (:mod:`rayguard.train.live`); start the new workers' training function. A kept worker
   waits for it as long as the notice says (``go_within_s``,
   :meth:`~rayguard.elastic.in_place.ResizePlan.go_within_s`: the bounds of steps 2 and 4,
   and for a grow Ray Train's worker-group start timeout for the new processes).

Any step that fails before 4 leaves the group as it was and answers ``False``: Ray's whole-
group restart runs, and the ``resize`` event says why (``fallback``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rayguard.elastic.in_place import ResizeInput, ResizePlan, plan_resize
from rayguard.events import make_event
from rayguard.health.live import setup_within_s
from rayguard.health.recovery import RESIZE
from rayguard.run.attempts import Attempt

logger = logging.getLogger("rayguard")

BARRIER_RESET_EVERY_S = 1.0
"""While kept workers have not all left the old attempt, how often Ray's report barrier is
reset (one blocked in a report of the old size waits for a peer that will not come)."""


def left_key(attempt: int, rank: int) -> str:
    """Coordinator key: ``rank`` of ``attempt`` has left it for a resize."""
    return f"resize:left:{attempt}:{rank}"


def go_key(attempt: int) -> str:
    """Coordinator key: the resized group of ``attempt`` is in place; ``{"places": {old rank:
    place}}``."""
    return f"resize:go:{attempt}"


class InPlaceResizer:
    """Carries out in-place resizes for :class:`~rayguard.controller.callbacks.RayGuardCallback`
    (which owns the run's attempt number and the failure that asks for a shrink)."""

    def __init__(self, coordinator: Any, wait_s: float = 30.0) -> None:
        self.coordinator = coordinator
        self.wait_s = wait_s

    def resize(self, worker_group: Any, new_world: int, *, attempt: int,
               failed: frozenset[int] = frozenset(),
               on_placed: Callable[[Any], None] = lambda wg: None) -> Attempt | None:
        """Resize ``worker_group`` of ``attempt`` to ``new_world`` workers in place if the
        plan allows; ``failed``: the ranks a lost node took (a shrink's). Returns the attempt
        it opened (``None``: not in place, the group restarts). ``on_placed(worker_group)``:
        called once the group holds its new workers, before any new worker starts (the
        rank-order hook's bookkeeping)."""
        import ray

        from rayguard._ray import resize as ray_resize

        old_world = len(worker_group.get_workers())
        plan = plan_resize(ResizeInput(
            old_world=old_world, new_world=new_world, failed=failed,
            free_bundles=tuple(ray_resize.free_bundles(worker_group))))
        if not plan.in_place:
            self._record(plan, attempt, None, {})
            return None
        started = time.monotonic()
        detail = (f"worker group resized in place from {old_world} to {new_world}: rank(s) "
                  f"{list(plan.keep)} keep their processes")
        start_s = ray_resize.worker_start_s(worker_group)
        resize = {"old_world_size": old_world, "world_size": new_world,
                  "direction": plan.direction, "go_within_s": plan.go_within_s(self.wait_s, start_s)}
        # the kept ranks wait at set-up for a grow's new workers as for a live replacement
        within_s = setup_within_s(self.wait_s, start_s) if plan.added else None
        opened: Attempt = ray.get(self.coordinator.open_attempt.remote(
            RESIZE, attempt, list(plan.lost) + list(plan.retire), detail, resize, within_s),
            timeout=30)
        if not self._await_left(worker_group, attempt, plan):
            why = (f"kept rank(s) did not leave attempt {attempt} within {self.wait_s} s "
                   "(HealthConfig(live_wait_s))")
            self._record(ResizePlan(old_world, new_world, lost=plan.lost, reason=why),
                         attempt, opened.number, {})
            return None
        phases = {"leave_s": time.monotonic() - started}
        ray_resize.survivors_cleared(worker_group, plan.keep)
        new: list[Any] = []
        if plan.added:
            new = ray_resize.grow_group(worker_group, plan.bundles, self.wait_s, phases)
        else:
            ray_resize.shrink_group(worker_group, plan.keep)
        on_placed(worker_group)
        workers = worker_group.get_workers()
        places = {str(old): ray_resize.place_fields(workers[i])
                  for i, old in enumerate(plan.keep)}
        ray.get(self.coordinator.put.remote(go_key(opened.number), {"places": places}),
                timeout=30)
        if new:
            ray_resize.start_new(worker_group, new)
        phases["controller_s"] = time.monotonic() - started
        self._record(plan, attempt, opened.number, phases)
        return opened

    def _await_left(self, worker_group: Any, attempt: int, plan: ResizePlan) -> bool:
        """Whether every kept worker left ``attempt`` within the bound (the barrier reset
        meanwhile)."""
        import ray

        from rayguard._ray.resize import reset_barrier

        keys = [left_key(attempt, r) for r in plan.keep]
        deadline = time.monotonic() + self.wait_s
        reset_at = time.monotonic() + BARRIER_RESET_EVERY_S
        while True:
            keys = sorted(set(keys) - set(ray.get(self.coordinator.present.remote(keys),
                                                  timeout=30)))  # ask only for the rest
            if not keys:
                return True
            now = time.monotonic()
            if now >= reset_at:  # before the bound: a wait that ends has reset it once
                try:
                    reset_barrier(worker_group)
                except Exception as exc:  # a dead sync actor: the restart path handles it
                    logger.debug("rayguard: report barrier not reset: %s", exc)
                reset_at = now + BARRIER_RESET_EVERY_S
            if now >= deadline:
                return False
            time.sleep(0.05)

    def _record(self, plan: ResizePlan, attempt: int, opened: int | None,
                phases: dict[str, float]) -> None:
        if plan.in_place:
            text = (f"worker group resized in place: {plan.old_world} -> {plan.new_world} "
                    f"worker(s); rank(s) {list(plan.keep)} keep their processes"
                    + (f", {plan.added} new worker(s)" if plan.added else "")
                    + f"; attempt {opened}")
        else:
            text = (f"worker group resize {plan.old_world} -> {plan.new_world} restarts the "
                    f"group: {plan.reason}")
        fields: dict[str, Any] = {**plan.event_fields(), "attempt": attempt}
        if opened is not None:
            fields["next_attempt"] = opened
        if phases:
            fields["phases"] = phases
        self.coordinator.record.remote(make_event("resize", text, **fields))  # the console's line


__all__ = ["BARRIER_RESET_EVERY_S", "InPlaceResizer", "go_key", "left_key"]
