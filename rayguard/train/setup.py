"""The set-up pipeline that runs in each worker before the user's training function.

Order: read Ray's rank info and check the environment -> the link to the run and the
watchdog (which covers the rest of set-up) -> preflight (doctor subset) -> NUMA binding ->
CUDA pinning -> per-rank seeding -> tensor serializers -> elastic geometry -> the ranks'
agreement and the preemption watch -> the session, built from these parts (memory tier,
checkpointer, report forwarding, faults) -> the guard around ``ray.train.report``. Each
step is small; the planners they call are pure.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rayguard import runtime
from rayguard._ray.spare import claim_process
from rayguard.config import GuardConfig
from rayguard.constants import FAULTS_ENV_VAR, NODE_AGENTS_ENV_VAR, SERIALIZERS_ENV_VAR
from rayguard.exceptions import PeersLostError, WorkerSetupError
from rayguard.faults import Fault, FaultInjector
from rayguard.faults.injector import announcer
from rayguard.faults.spec import faults_from
from rayguard.health.hang import HangProbe, install_counting_hook
from rayguard.health.live import LAST_COMMITTED_KEY, opened_key, setup_wait_s
from rayguard.health.report_wait import returned_check
from rayguard.health.stall import StallResponder, dump_stacks, watch_optimizer_steps
from rayguard.health.watchdog import Watchdog
from rayguard.run.link import RunLink, make_link
from rayguard.run.timeouts import read_attempt
from rayguard.train import ray_report
from rayguard.train.agreement import Agreement, LocalAgreement, make_agreement
from rayguard.train.checkpointer import Checkpointer
from rayguard.train.context import GuardContext, set_context
from rayguard.train.elastic_setup import apply_elastic, previous_assignment
from rayguard.train.forwarder import Forwarder
from rayguard.train.forwarding import ReportForwarding, ray_own_report
from rayguard.train.live import AttemptSuperseded, keep_spare, release_spare, setup_lost
from rayguard.train.live import ResizeWatch as resize_watch
from rayguard.train.memory_tier import MemoryTier
from rayguard.train.pacing import pacing_for
from rayguard.train.pinning import bind_numa, pin_cuda
from rayguard.train.preemption import PreemptionWatch, set_active, watch_preemption
from rayguard.train.rollback import RollBack, re_enter
from rayguard.train.seeding import rank_seed, seed_everything
from rayguard.train.session import LateSession, WorkerSession, current_session, set_current_session
from rayguard.train.store import CheckpointStore, LocalStore, store_for

logger = logging.getLogger("rayguard")

_ENV_TO_CTX = (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
               ("LOCAL_WORLD_SIZE", "local_world_size"))


def check_rank_env(env: dict[str, str], ctx: GuardContext) -> None:
    """RANK/WORLD_SIZE/LOCAL_RANK as set in the worker must agree with Ray's own view."""
    problems = []
    for var, attr in _ENV_TO_CTX:
        raw = env.get(var)
        if raw is None:
            continue
        expected = getattr(ctx, attr)
        if not raw.strip().lstrip("-").isdigit():
            problems.append(f"{var}={raw!r} is not an integer (Ray says {expected})")
        elif int(raw) != expected:
            problems.append(f"{var}={raw} but Ray Train assigned {expected}")
    if not 0 <= ctx.rank < ctx.world_size:
        problems.append(f"rank {ctx.rank} outside world size {ctx.world_size}")
    if not 0 <= ctx.local_rank < ctx.local_world_size:
        problems.append(f"local rank {ctx.local_rank} outside local world size {ctx.local_world_size}")
    if problems:
        raise WorkerSetupError(
            f"rank {ctx.rank} on node {ctx.node_id[:8]}: inconsistent distributed environment: "
            + "; ".join(problems)
            + ". Fix: do not set RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE yourself "
            "(runtime_env env_vars, the node's environment); Ray Train sets them per worker."
        )


def _base_context(run_dir: str, attempt: int) -> GuardContext:
    import ray
    import ray.train
    import torch

    rctx = ray.train.get_context()
    return GuardContext(
        rank=rctx.get_world_rank(), local_rank=rctx.get_local_rank(),
        world_size=rctx.get_world_size(), local_world_size=rctx.get_local_world_size(),
        node_rank=rctx.get_node_rank(), node_id=ray.get_runtime_context().get_node_id(),
        device=torch.device("cpu"), seed=None, attempt=attempt, run_dir=run_dir,
    )


def _worker_info(ctx: GuardContext) -> dict[str, Any]:
    import ray

    resources = ray.get_runtime_context().get_assigned_resources()
    gpus = resources.get("GPU", 0.0)
    return {"rank": ctx.rank, "node_id": ctx.node_id, "local_rank": ctx.local_rank,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "num_cpus": resources.get("CPU", 0.0), "fractional_gpu": 0 < gpus < 1,
            "pid": os.getpid()}


def _setup_infos(link: RunLink, ctx: GuardContext, *, by_marks: bool = False,
                 wait_s: float | None = None, started: float | None = None,
                 survivor: bool = False) -> list[dict[str, Any]]:
    """Every rank's :func:`_worker_info`. A worker :attr:`~RunLink.alone` (its own replica
    group), or one Ray may replace alone (``by_marks``: live recovery), leaves its own with
    the coordinator and reads the others' there (a replacement finds its peers', left when
    they started or rejoined; a ``survivor`` waits for it as long as the notice says)."""
    mine = {**_worker_info(ctx), "setup_start_time": started}
    if not (link.alone or by_marks):
        return link.gather("setup", mine)
    if survivor and wait_s is not None:  # its replacements' processes may still be starting
        wait_s = setup_wait_s(link.get(opened_key(ctx.attempt)), wait_s)
    try:  # kept: a replacement started later gets its peers' at once
        return link.gather("setup", mine, kept=True, timeout_s=wait_s)
    except PeersLostError:
        if by_marks and wait_s is not None:  # a live attempt: its replacement may fail first
            setup_lost(link, wait_s)
        raise


def _preflight(ctx: GuardContext, guard: GuardConfig) -> None:
    if not guard.preflight:
        return
    from rayguard.doctor import raise_on_errors, worker_preflight

    findings = worker_preflight(dict(os.environ), local_world_size=ctx.local_world_size)
    raise_on_errors(findings, rank=ctx.rank, node=ctx.node_id)


def register_serializers(guard: GuardConfig) -> None:
    """Register the tensor serializers in this process (driver or worker) unless turned off
    by ``GuardConfig(serializers=False)`` or ``RAYGUARD_SERIALIZERS=0``."""
    if not guard.serializers or os.environ.get(SERIALIZERS_ENV_VAR, "1") == "0":
        return
    from rayguard.serialization import register_tensor_serializers

    register_tensor_serializers()


def _store(run_dir: str) -> CheckpointStore:
    """The run's checkpoint store, chosen once from its storage filesystem."""
    import ray.train

    return store_for(run_dir, ray.train.get_context().get_storage().storage_filesystem)


def start_watch(link: RunLink, guard: GuardConfig, store: CheckpointStore, *,
                live: bool = False) -> tuple[RunLink, Watchdog, LateSession, HangProbe]:
    """The watchdog of this worker, with its stall responder and hang probe (built in the
    training thread: its top frame goes in a diagnosis), and the loop's link (whose waits
    feed it)."""
    last_step = LateSession()
    local = store.fs is None
    probe = HangProbe(link, dump=lambda: dump_stacks(link.ctx, local_run_dir=local),
                      wait_s=guard.health.diagnosis_wait_s)
    tick = probe.tick
    if live and link.ctx.world_size > 1:  # NCCL: a lost peer's notice aborts the group
        from rayguard.train.live import LiveWatch

        watch = LiveWatch(link)

        def tick() -> None:
            probe.tick()
            watch.tick()
    watchdog = Watchdog(guard.health, on_stall=StallResponder(
        link, last_step=last_step, local_run_dir=local, probe=probe), on_tick=tick)
    return link.feeding(watchdog.heartbeat), watchdog, last_step, probe


def assemble(link: RunLink, guard: GuardConfig, *, watchdog: Watchdog, store: CheckpointStore,
             agreement: Agreement, preemption: PreemptionWatch, forwarding: ReportForwarding,
             faults: tuple[Fault, ...] = ()) -> WorkerSession:
    """The session of a worker from its parts (the memory tier and the checkpointer are
    built here, over the same link and store)."""
    tier = MemoryTier.for_run(link, guard.checkpoint, store.fs)
    checkpointer = Checkpointer(link, store, guard.checkpoint, tier)
    return WorkerSession(link, guard, watchdog=watchdog, checkpointer=checkpointer,
                         agreement=agreement, preemption=preemption, forwarding=forwarding,
                         faults=faults, pacing=pacing_for(guard.checkpoint, link.ctx, store.fs))


def build_session(ctx: GuardContext, guard: GuardConfig, actor: Any = None,
                  faults: tuple[Fault, ...] = (), *, store: CheckpointStore | None = None,
                  raw_report: Callable[..., None] = ray_own_report) -> WorkerSession:
    """A session outside set-up (one rank, no preemption watch, the watchdog not
    started): benchmarks and tests."""
    store = store or LocalStore(ctx.run_dir)
    link, watchdog, last_step, _ = start_watch(make_link(ctx, actor), guard, store)
    agreement = LocalAgreement()
    forwarding = ReportForwarding(Forwarder(), store.fs, raw=raw_report)
    session = assemble(link, guard, watchdog=watchdog, store=store, agreement=agreement,
                       preemption=PreemptionWatch(link, agreement), forwarding=forwarding,
                       faults=faults)
    last_step.session = session
    return session


class GuardedTrainFn:
    """The function Ray Train runs in each worker: rayguard's set-up, then the user's loop."""

    def __init__(self, inner: Callable[[], Any], guard: GuardConfig, coordinator: Any,
                 run_dir: str, *, replica_groups: bool = False, max_failures: int = -1,
                 live: bool = False, elastic: bool = False) -> None:
        self.inner = inner
        self.guard = guard
        self.coordinator = coordinator
        self.run_dir = run_dir
        self.replica_groups = replica_groups
        """Whether Ray runs each worker as its own replica group (``TorchftConfig``) and
        replaces a failed one alone: rayguard's gathers then stay within the worker."""
        self.max_failures = max_failures
        """The run's restart budget (``FailureConfig(max_failures)``; -1: unlimited): it
        bounds the in-place rollbacks too."""
        self.live = live
        """Live recovery (:mod:`rayguard.train.live`): the survivors keep their processes."""
        self.elastic = elastic  # size changes in place (rayguard.controller.resize)

    @runtime.worker()  # each call binds this worker's runtime (rayguard.runtime) around it
    def __call__(self) -> Any:
        attempt = None  # set when this process rejoins a live recovery
        while True:
            try:
                session, hook, bridge = self._set_up(attempt)
            except AttemptSuperseded as moved:  # its replacement failed before it joined
                attempt = moved.attempt
                continue
            try:
                try:
                    result = self._run(session, bridge)
                    session.finish()  # the checkpoint in flight commits (or raises) first
                except BaseException as exc:
                    if self.live:  # no report of this attempt may start after Ray's reset
                        session.forwarder.hold()
                    session.settle()
                    set_active(False)
                    session.watchdog.stop()
                    attempt = self._rejoin(session, exc)
                    if attempt is None:
                        session.forwarder.resume()
                        session.forwarder.flush_quietly(timeout_s=5)  # keep what was reported
                        session.report_failure(exc)
                        raise
                    continue
                set_active(False)
                session.close()
                set_context(None)
                if self.live:
                    release_spare(session.ctx)
                return result
            finally:
                if hook is not None:  # its optimizers' steps are no longer this session's
                    hook.remove()
                ray_report.uninstall(bridge)

    def _rejoin(self, session: WorkerSession, exc: BaseException) -> int | None:
        """The attempt this process rejoins after ``exc`` (``None``: it raises)."""
        if not self.live or (session.ctx.world_size < 2 and not self.elastic):
            return None
        from rayguard.train.live import leave_group, rejoin_attempt, take_place

        wait_s = self.guard.health.live_wait_s
        attempt = rejoin_attempt(session.link, exc, wait_s)
        if attempt is None:
            return None
        session.end_attempt_steps()
        if not session.forwarder.abandon(wait_s):  # Ray's barrier reset releases it
            raise PeersLostError(
                f"rank {session.ctx.rank}: live recovery: a report of attempt "
                f"{session.ctx.attempt} still waits in ray.train.report after {wait_s} s "
                "(HealthConfig(live_wait_s)); this rank is replaced too") from exc
        session.checkpointer.close()
        leave_group()
        take_place(session.link, attempt, wait_s)  # a resize in place: this rank's new place
        return attempt

    def _run(self, session: WorkerSession, bridge: ray_report.RayReportBridge) -> Any:
        """The user's function; again in this process after each in-place rollback."""
        while True:
            try:
                return self.inner()
            except RollBack as rollback:
                re_enter(session, bridge, rollback, self.max_failures)

    def _set_up(self, attempt: int | None = None
                ) -> tuple[WorkerSession, Any, ray_report.RayReportBridge]:
        from rayguard._ray.console import quiet_worker
        from rayguard.logs import configure_logging, quiet_ray_reports

        setup_start_time = time.time()  # the set-up phase of a restart begins (goodput)
        claim_process()  # a warm spare that Ray gave this worker is a spare no more
        configure_logging()
        quiet_ray_reports()
        quiet_worker()  # a traceback that only says a peer died: rayguard's line says it

        ctx = _base_context(self.run_dir, read_attempt(self.coordinator)
                            if attempt is None else attempt)
        check_rank_env(dict(os.environ), ctx)
        faults = faults_from(self.guard.faults, os.environ.get(FAULTS_ENV_VAR))
        store = _store(ctx.run_dir)
        link, watchdog, last_step, probe = start_watch(
            make_link(ctx, self.coordinator, alone=self.replica_groups,
                      agents=os.environ.get(NODE_AGENTS_ENV_VAR)), self.guard, store,
            live=self.live)
        watchdog.start()  # the watchdog covers set-up too (floor covers start-up)
        hook = watch_optimizer_steps(watchdog.heartbeat, last_step.optimizer_stepped)
        try:
            _preflight(ctx, self.guard)
        except Exception as exc:
            link.record("preflight_error", str(exc), wait=True)
            raise
        previous = previous_assignment(link)  # every rank reads it before rank 0 replaces it
        FaultInjector(faults, rank=ctx.rank, attempt=ctx.attempt, claim=link.claim,
                      on_fire=announcer(link, lambda: -1)).on_setup()
        try:
            infos = _setup_infos(link, ctx, by_marks=self.live, survivor=attempt is not None,
                                 wait_s=self.guard.health.live_wait_s
                                 if self.live and ctx.attempt > 0 else None,
                                 started=setup_start_time)
        except AttemptSuperseded:
            watchdog.stop()
            hook.remove()
            raise
        bind_numa(ctx, self.guard, infos)
        pin_cuda(ctx, infos)
        live_path = self._form_group(link, setup_start_time, replacement=attempt is None)
        if self.live:
            keep_spare(ctx, infos, after_s=self.guard.health.live_spare_after_s)
        if live_path:  # the attempt's set-up began with its last rank's (the replacement's)
            setup_start_time = max(i.get("setup_start_time") or setup_start_time for i in infos)
        probe.publish_place()  # a rank that never answers a hang diagnosis is still placed
        if ctx.world_size > 1:
            install_counting_hook()  # only where torch's Flight Recorder records nothing
        if self.guard.seed is not None:
            ctx.seed = rank_seed(self.guard.seed, ctx.rank)
            seed_everything(ctx.seed, deterministic=self.guard.deterministic)
        register_serializers(self.guard)
        apply_elastic(ctx, self.guard, previous)
        inner = ray_report.ray_own_utils(ctx if self.live else None)  # reports' attempt
        session = self._session(link, watchdog, store, faults, inner)
        last_step.session = session
        set_context(ctx)
        set_current_session(session)
        bridge = ray_report.install(ray_report.RayReportBridge(  # every ray.train.report
            session, link, session.forwarder, session.checkpointer.collective, store, inner,
            in_place=self.guard.recovery == "live",
            accept_unsealed=self.guard.checkpoint.accept_unsealed))
        if live_path:  # get_checkpoint(): the run's last commit, verified again when chosen
            bridge.rolled_back(committed := link.get(LAST_COMMITTED_KEY),
                               reported=committed is not None)
        if ctx.rank == 0:
            link.record("attempt_started", f"attempt {ctx.attempt} started with "
                        f"{ctx.world_size} worker(s)", world_size=ctx.world_size,
                        setup_start_time=setup_start_time, **live_path)
        return session, hook, bridge

    def _form_group(self, link: RunLink, setup_start_time: float, *, replacement: bool
                    ) -> dict[str, Any]:
        """Live recovery: a replacement, or a survivor that rejoins (even alone: shrunk to one
        in place), has no process group; form it (``{"path": "live", ...}`` for the event)."""
        import torch.distributed as dist

        if not self.live or dist.is_initialized():
            return {}
        from rayguard.train.live import record_rejoined, rendezvous

        formed_at = time.time()
        phases = rendezvous(link, self.guard.health.live_wait_s)
        record_rejoined(link, replacement=replacement, setup_start_time=setup_start_time,
                        formed_at=formed_at, phases=phases)
        return {"path": "live", "phases": {"rendezvous_s": phases["rendezvous_s"]}}

    def _session(self, link: RunLink, watchdog: Watchdog, store: CheckpointStore,
                 faults: tuple[Fault, ...], inner: Any) -> WorkerSession:
        """The ranks' agreement, the preemption watch, the forwarding to Ray's own report
        (``inner``'s); the session from them."""
        from rayguard.train.live import peer_lost

        lost = peer_lost(link) if self.live and link.peers > 1 else None
        agreement = make_agreement(link.peers, link.gather, watchdog.heartbeat, lost,
                                   returned_check(link))
        forwarder = Forwarder()
        preemption = watch_preemption(link, agreement, stop=watchdog.stop,
                                      flush=lambda timeout_s: forwarder.flush(timeout_s=timeout_s))
        forwarding = ReportForwarding(forwarder, store.fs, raw=ray_report.raw_report_of(inner))
        session = assemble(link, self.guard, watchdog=watchdog, store=store, agreement=agreement,
                           preemption=preemption, forwarding=forwarding, faults=faults)
        session.resize_watch = resize_watch(link) if self.live and self.elastic else None
        return session


__all__ = ["GuardedTrainFn", "build_session", "check_rank_env", "current_session",
           "register_serializers"]
