"""Controller-side hooks (these run in Ray Train's controller actor): open each worker
group's attempt at the run's coordinator (:mod:`rayguard.run.attempts`), write worker deaths
and restarts into the run's event log, count each death against its node
(:mod:`rayguard.health.quarantine`), place each new worker group off quarantined nodes, and
apply the recovery path :func:`rayguard.health.recovery.plan_recovery_path` chooses (Ray's
controller replaces failed replica groups alone unless every worker of the poll failed:
where the plan is a whole-group restart, every worker is marked failed)."""

from __future__ import annotations

import logging
import time
from typing import Any

from rayguard._ray.core import alive_node_resources
from rayguard._ray.resize import worker_start_s
from rayguard._ray.train import (
    ControllerCallback,
    WorkerGroupCallback,
    fail_every_worker,
    fail_workers,
    group_label_selector,
    group_nodes,
    marked_failed,
    set_group_label_selector,
    unwrap_worker_error,
)
from rayguard.controller.fence import FenceView
from rayguard.controller.replica_barrier import ReplicaBarrier
from rayguard.controller.resize import InPlaceResizer
from rayguard.events import make_event
from rayguard.exceptions import PeersLostError, RayGuardError
from rayguard.failures import classify
from rayguard.health.live import LAST_COMMITTED_KEY, setup_within_s
from rayguard.health.quarantine import NodeFailure, node_failure_reason
from rayguard.health.recovery import (
    LIVE,
    REPLICA_GROUP,
    RESIZE,
    RESTART,
    LiveAttempt,
    RecoveryKind,
    RecoveryPath,
    plan_recovery_path,
)
from rayguard.health.report_wait import finished_ranks
from rayguard.placement.exclude import exclude_nodes
from rayguard.run.attempts import Attempt
from rayguard.run.facts import RETURNED, cause_key

logger = logging.getLogger("rayguard")


_UNKNOWN = object()  # a coordinator that did not answer

RAISE_GRACE_S = 1.0
"""Under live recovery, how long the controller waits, once a poll shows a rank that raised
(its own exception, not a death), for the other ranks raising with it (a bug every rank
hits, a checkpoint none can load), so that they are planned for together: a whole-group
restart, not one rank replaced alone whose peers then fail the live attempt. Kills, deaths
and hangs are planned at once."""


class RayGuardCallback(WorkerGroupCallback, ControllerCallback):
    def __init__(self, coordinator: Any, quarantine: bool = False, *,
                 mode: RecoveryKind | str = RESTART, elastic: bool = False,
                 live_wait_s: float = 30.0) -> None:
        self.coordinator = coordinator
        self.fence = FenceView(coordinator) if quarantine else None
        """The quarantined nodes (``None``: quarantine off, no node is counted or left out)."""
        self.mode = RecoveryKind(mode)
        """How a failed worker can be recovered (:func:`rayguard.health.recovery.recovery_mode`):
        ``LIVE`` (a replacement opens a new attempt, which the survivors rejoin:
        :mod:`rayguard.train.live`), ``REPLICA_GROUP`` (``TorchftConfig``: Ray replaces a
        failed replica group alone, no new attempt, torchft's own quorum) or ``RESTART``."""
        if self.mode not in (RESTART, LIVE, REPLICA_GROUP):
            raise ValueError(f"RayGuardCallback(mode={self.mode.value!r}): must be restart, "
                             "live or replica_group")
        self._attempt = -1
        self._reported: set[tuple[int, int]] = set()
        self._nodes: list[str] = []  # the node of each rank of the running group
        self._failed: set[int] = set()  # the ranks failed at the last poll
        self._world = 0  # the ranks the last poll saw
        self._returned: list[int] | None = None  # what RETURNED holds
        self._plan: RecoveryPath | None = None  # the path of the last poll's failure
        self._live: tuple[Attempt, Any, tuple[int, int] | None] | None = None
        """The live attempt this group runs, with the last committed checkpoint when it
        opened and, when a resize in place opened it, its (old, new) world size; ``None``:
        the group's own start."""
        self.elastic = elastic
        """The run's size may change (``ScalingConfig(num_workers=(min, max))``)."""
        self.live_wait_s = live_wait_s
        self._setup_within_s = live_wait_s  # a live attempt's (after_worker_group_start)
        self.resizer: InPlaceResizer | None = (
            InPlaceResizer(coordinator, live_wait_s) if elastic and self.mode == LIVE else None)
        """Live recovery on an elastic run: size changes are made in place where they can
        be (:mod:`rayguard.controller.resize`)."""
        self._shrink: frozenset[int] | None = None
        """The ranks a lost node took, when the next size change is their shrink."""
        self._restarting = False
        """The last failure's recovery restarts the whole group: Ray's next size decision
        (its restart) is not made in place, whatever its size."""
        self.replica_barrier = ReplicaBarrier(coordinator)  # after Ray's replica-group path

    @property
    def report_floor(self) -> int:
        """A report made before this attempt is a failed one's (-1: the group's own start)."""
        return -1 if self._live is None else self._live[0].number

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        """Runs in the controller before each worker group starts: a new attempt, placed off
        the quarantined nodes (merged with the user's ``label_selector``)."""
        import ray

        from rayguard._ray.console import quiet_controller

        quiet_controller()  # a crashed worker's shutdown traceback: rayguard's line says it
        opened: Attempt = ray.get(self.coordinator.open_attempt.remote(RESTART))
        self._attempt = opened.number
        self._nodes, self._live, self._restarting = [], None, False
        self._failed, self._plan, self._shrink = set(), None, None
        self._put_returned([])
        if self.fence is None:
            return
        excluded = self.fence(fresh=True)
        selectors, num_workers = group_label_selector(worker_group_context)
        if excluded:
            set_group_label_selector(worker_group_context,
                                     exclude_nodes(selectors, excluded, num_workers))

    def _put_returned(self, ranks: list[int]) -> None:
        """Ranks whose training function returned (:mod:`rayguard.health.report_wait`)."""
        if ranks != self._returned:
            self._returned = ranks
            self.coordinator.put.remote(RETURNED, ranks)

    def after_worker_group_start(self, worker_group: Any) -> None:
        """Runs in the controller once the group's workers exist: each rank's node, and how
        long a live attempt's survivors wait for its replacements (:func:`setup_within_s`)."""
        if self.fence is not None or self.mode == LIVE:
            self._nodes = group_nodes(worker_group)
        self._setup_within_s = setup_within_s(self.live_wait_s, worker_start_s(worker_group))
        self.replica_barrier.started(worker_group)

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        """Runs in the controller after each poll: record every worker error once (a replica
        group's replacement's not by its predecessor's mark), classified where it happens
        (:func:`rayguard.failures.classify`), as one line plus the whole text in ``details``."""
        import ray

        counted: list[NodeFailure] = []
        statuses = getattr(worker_group_status, "worker_statuses", None) or {}
        self._world = len(statuses)
        self._put_returned(finished_ranks(statuses))
        for rank, status in statuses.items():  # a replica group's replacement, running
            if getattr(status, "error", None) is None and (self._attempt, rank) in self._reported:
                self._reported.discard((self._attempt, rank))  # in its predecessor's attempt,
                self.coordinator.put.remote(cause_key(self._attempt, rank), None)  # may fail too
        self._failed = set(worker_group_status.errors)
        if self._failed:
            self._sync_attempt()
        raised = False  # a rank's own exception (not a death): its peers may raise with it
        for rank, error in worker_group_status.errors.items():
            if (self._attempt, rank) in self._reported:
                continue
            self._reported.add((self._attempt, rank))
            try:
                marked = ray.get(self.coordinator.get.remote(cause_key(self._attempt, rank)),
                                 timeout=10)
            except Exception:
                marked = None
            failure = classify(unwrap_worker_error(error), marked)
            raised = raised or (failure.cause == "error" and not marked_failed(error))
            node = self._nodes[rank] if rank < len(self._nodes) else None
            self.coordinator.record.remote(make_event(
                "worker_died", f"rank {rank} failed: {failure.reason}", rank=rank, node=node,
                attempt=self._attempt, **failure.event_fields()))
            reason = node_failure_reason(failure) if self.fence is not None else None
            if node is not None and reason is not None:
                counted.append(NodeFailure(node, self._attempt, reason, rank, failure.reason))
        if self._failed:
            live_partial = self.mode == LIVE and len(self._failed) < self._world
            self._failed |= self._raised_unseen(
                worker_group_status, RAISE_GRACE_S if raised and live_partial else 0.0)
        if counted:
            self._count(counted)
        self._plan = self._plan_recovery(worker_group_status) if self._failed else None
        self.replica_barrier.poll(statuses, self._attempt)

    def _raised_unseen(self, worker_group_status: Any, grace_s: float = 0.0) -> set[int]:
        """Ranks whose function raised in this attempt but whose error this poll does not
        show yet (a bug every rank hits, seen one rank per poll): they fail at this poll
        with the others, so that the recovery is planned for all of them at once (a rank
        replaced alone while its peer is already going would fail the live attempt).
        ``grace_s``: how long to wait for more of them (:data:`RAISE_GRACE_S`)."""
        import ray

        deadline = time.monotonic() + grace_s
        while True:
            try:
                raised = dict(ray.get(self.coordinator.failed_ranks.remote(self._attempt),
                                      timeout=10))
            except Exception:
                return set()
            unseen = {r for r in raised if r not in self._failed
                      and r in worker_group_status.worker_statuses}
            if len(self._failed) + len(unseen) >= self._world or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if not unseen:
            return set()
        fail_workers(worker_group_status, unseen, PeersLostError(
            f"rank(s) {sorted(unseen)} raised in attempt {self._attempt}; the error reaches "
            "Ray after this poll"))
        for rank in sorted(unseen):
            record = raised[rank]
            self._reported.add((self._attempt, rank))
            self.coordinator.record.remote(make_event(
                "worker_died", f"rank {rank} failed: {record.summary}", rank=rank,
                node=self._nodes[rank] if rank < len(self._nodes) else None,
                attempt=self._attempt, failure="error",
                error_type=record.error_type, details=record.traceback or record.summary))
        return unseen

    def _sync_attempt(self) -> None:
        """The failed ranks ran in the run's latest attempt: an in-place rollback
        (:mod:`rayguard.train.rollback`) opens attempts in the workers, after this group's
        start, and its failures are the rollback's attempt's."""
        import ray
        from ray.exceptions import RayError

        try:
            latest: Attempt | None = ray.get(self.coordinator.latest_attempt.remote(),
                                             timeout=10)
        except RayError as exc:  # a timeout, the actor gone
            logger.warning(
                "rayguard: the run's coordinator did not say its latest attempt (%s): this "
                "poll's worker failures are recorded under attempt %s, the group's own; an "
                "in-place rollback since may have moved the workers to a later one", exc,
                self._attempt)
            return
        if latest is None or latest.number < self._attempt:
            raise RayGuardError(
                f"the run's coordinator says its latest attempt is "
                f"{None if latest is None else latest.number}, before attempt {self._attempt} "
                "that this controller opened there: it lost the run's attempts (a new "
                "coordinator?), so failures can no longer be told apart by attempt")
        self._attempt = latest.number

    def _plan_recovery(self, worker_group_status: Any) -> RecoveryPath:
        """The poll's recovery path (:func:`rayguard.health.live.plan_recovery_path`),
        applied where Ray's controller would otherwise replace workers alone: every worker
        is marked failed, so that the whole group restarts."""
        mode, partial = self.mode, len(self._failed) < self._world
        live_attempt = self._live_attempt() if mode == LIVE else None
        failed_live = live_attempt is not None and not live_attempt.settled
        lost = self._lost_nodes() if mode == LIVE and partial and not failed_live else []
        plan = plan_recovery_path(self._failed, self._world, mode=mode, attempt=self._attempt,
                                  live_attempt=live_attempt, lost_nodes=lost,
                                  elastic=self.resizer is not None, returned=self._returned or ())
        if not plan.alone and partial and mode != RESTART and plan.kind != RESIZE:
                fail_every_worker(worker_group_status, PeersLostError(plan.reason))
        return plan

    def _live_attempt(self) -> LiveAttempt | None:
        """The failed attempt as a live recovery opened it (``None``: it was not one)."""
        if self._live is None or self._live[0].number != self._attempt:
            return None
        opened, committed, resized = self._live
        now = self._committed()
        settled = now is not _UNKNOWN and committed is not _UNKNOWN and now != committed
        return LiveAttempt(opened.number, opened.replaced, settled=settled, resized=resized)

    def _committed(self) -> Any:
        """The run's last committed checkpoint (``None``: none yet; :data:`_UNKNOWN`: the
        coordinator did not answer)."""
        import ray

        try:
            return ray.get(self.coordinator.get.remote(LAST_COMMITTED_KEY), timeout=10)
        except Exception:
            return _UNKNOWN

    def _count(self, failures: list[NodeFailure]) -> None:
        """Count node failures before the failure decision, so that the next group's
        placement already leaves out a node they quarantine."""
        import ray

        try:
            nodes_alive = len(alive_node_resources())
            ray.get(self.coordinator.record_node_failures.remote(failures, nodes_alive),
                    timeout=30)
        except Exception as exc:  # never fail the run for the quarantine's sake
            logger.warning("rayguard: node failures not counted: %s", exc)

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        """Runs in the controller when a failure was handled: RETRY means a recovery, on the
        path the last poll planned."""
        decision = getattr(failure_decision, "value", str(failure_decision))
        if decision != "RETRY":
            return
        plan = self._plan or plan_recovery_path((), self._world, mode=self.mode,
                                                attempt=self._attempt)
        self._plan = None
        if plan.kind == LIVE:
            self._open_live(plan)
            return
        if plan.kind == RESIZE:  # the elastic policy's size comes next: resize_in_place
            self._shrink = frozenset(plan.ranks)
            return
        self._restarting = True
        ranks, attempt = list(plan.ranks), plan.attempt
        if plan.kind == REPLICA_GROUP:
            self.replica_barrier.replaced(ranks)  # survivors late to Ray's reset: released
            detail = (f"rank(s) {ranks} replaced in attempt {attempt} (Ray's replica-group "
                      "restart); the other workers keep their processes")
        else:
            detail = (f"worker group restarts after attempt {attempt}"
                      + (f" ({plan.fallback})" if plan.fallback else ""))
        self.coordinator.record.remote(make_event("restart", detail, attempt=attempt,
                                                  **plan.event_fields()))

    def _open_live(self, plan: RecoveryPath) -> None:
        """Live recovery: the next attempt opens before Ray starts the replacement (which
        reads it), and the survivors' notice with it (:mod:`rayguard.health.live`)."""
        import ray

        old, ranks = plan.attempt, list(plan.ranks)
        detail = (f"rank(s) {ranks} of attempt {old} replaced alone; the other workers keep "
                  "their processes and rejoin")
        committed = self._committed()
        opened: Attempt = ray.get(self.coordinator.open_attempt.remote(
            LIVE, old, ranks, detail, within_s=self._setup_within_s), timeout=30)
        self._attempt = opened.number
        self._live = (opened, committed, None)
        self.coordinator.record.remote(make_event(
            "restart", f"{detail} in attempt {opened.number}", attempt=old,
            **plan.event_fields(), next_attempt=opened.number))

    def replacement_failed(self, error: BaseException) -> None:
        """Ray's replacement of a worker alone met another dead worker: the whole group
        restarts (the ``restart`` event says so)."""
        from rayguard.failures.messages import one_line

        why = (f"live recovery falls back to a restart of the whole group: the replacement "
               f"of a worker alone found another worker dead ({one_line(error)[:160]})")
        self.coordinator.record.remote(make_event(
            "restart", f"worker group restarts after attempt {self._attempt} ({why})",
            attempt=self._attempt, fallback=why))

    def wants_resize(self, worker_group: Any, new_world: int) -> bool:
        """Whether the size change to ``new_world`` is this callback's to make (a lost
        node's shrink, or another size on an elastic live run); ``False``: Ray's own path
        (the same size: a worker replaced alone)."""
        if self.resizer is None:
            return False
        if self._restarting:  # the planned restart (a resized attempt that failed, ...)
            self._restarting = False
            return False
        return self._shrink is not None or new_world != len(worker_group.get_workers())

    def resize_in_place(self, worker_group: Any, new_world: int,
                        on_placed: Any = lambda wg: None) -> bool:
        """Resize the running group to ``new_world`` in place (:mod:`rayguard.controller.
        resize`); ``False``: it cannot be, and the group restarts (said in the ``resize``
        event)."""
        assert self.resizer is not None
        shrink, self._shrink = self._shrink, None
        if shrink is None and new_world < len(worker_group.get_workers()):
            shrink = self._ranks_off(worker_group)  # the policy saw the loss before a poll
        committed, old_world = self._committed(), len(worker_group.get_workers())
        opened = self.resizer.resize(worker_group, new_world, attempt=self._attempt,
                                     failed=shrink or frozenset(), on_placed=on_placed)
        if opened is None:
            return False
        self._attempt = opened.number
        self._live = (opened, committed, (old_world, new_world))
        self._nodes = group_nodes(worker_group)
        return True

    def _ranks_off(self, worker_group: Any) -> frozenset[int]:
        """Ranks of the running group on nodes that are gone or quarantined (empty: the
        elastic policy shrinks for another reason, and the group restarts)."""
        try:
            alive = set(alive_node_resources())
            fenced = set(self.fence(fresh=True)) if self.fence is not None else set()
        except Exception:
            return frozenset()
        return frozenset(r for r, node in enumerate(group_nodes(worker_group))
                         if node not in alive or node in fenced)

    def _lost_nodes(self) -> list[str]:
        """The nodes of failed ranks that are gone (Ray's one-worker replacement would wait
        without end for the placement-group bundle on one)."""
        try:
            alive = set(alive_node_resources())
        except Exception:
            return []
        return sorted({self._nodes[r] for r in self._failed
                       if r < len(self._nodes) and self._nodes[r] not in alive})
