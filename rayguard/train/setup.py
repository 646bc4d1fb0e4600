"""The set-up pipeline that runs in each worker before the user's training function.

Order: read Ray's rank info and check the environment -> preflight (doctor subset) ->
NUMA binding -> CUDA pinning -> per-rank seeding -> tensor serializers -> elastic geometry ->
session (watchdog, reporter, faults). Each step is small; the planners they call are pure.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from rayguard.config import GuardConfig
from rayguard.constants import FAULTS_ENV_VAR, SERIALIZERS_ENV_VAR
from rayguard.exceptions import WorkerSetupError
from rayguard.placement.cuda import PinnedWorker, check_unique_devices, resolve_cuda_device
from rayguard.testing.faults import parse_faults
from rayguard.train import ray_report
from rayguard.train.agreement import make_agreement
from rayguard.train.context import GuardContext, set_context
from rayguard.train.elastic_setup import apply_elastic, previous_assignment
from rayguard.train.preemption import set_active, watch_preemption
from rayguard.train.seeding import rank_seed, seed_everything
from rayguard.train.session import WorkerSession
from rayguard.train.store import CheckpointStore, store_for

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
            f"rank {ctx.rank} on node {ctx.node_id}: inconsistent distributed environment: "
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


def _pin_cuda(ctx: GuardContext, infos: list[dict[str, Any]]) -> None:
    import torch

    me = infos[ctx.rank]
    ctx.gpu_ids = tuple(me["gpu_ids"])
    check_unique_devices([PinnedWorker(i["rank"], i["node_id"], tuple(i["gpu_ids"]),
                                       i["fractional_gpu"]) for i in infos])
    if not ctx.gpu_ids:
        return
    if not torch.cuda.is_available():
        logger.warning("rank %s: Ray assigned GPUs %s but torch sees no CUDA device; running on "
                       "CPU (logical GPUs).", ctx.rank, list(ctx.gpu_ids))
        return
    placement = resolve_cuda_device(ctx.gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                    torch.cuda.device_count(), rank=ctx.rank, node=ctx.node_id)
    torch.cuda.set_device(placement.ordinal)
    ctx.device = torch.device(placement.device)


def _preflight(ctx: GuardContext, guard: GuardConfig) -> None:
    if not guard.preflight:
        return
    from rayguard.doctor import raise_on_errors, worker_preflight

    findings = worker_preflight(dict(os.environ), local_world_size=ctx.local_world_size)
    raise_on_errors(findings, rank=ctx.rank, node=ctx.node_id)


def _bind_numa(ctx: GuardContext, guard: GuardConfig, infos: list[dict[str, Any]]) -> None:
    if guard.numa == "off":
        return
    from rayguard.placement.binding import setup_numa

    peers = [{"local_rank": i["local_rank"], "gpu_ids": i["gpu_ids"], "num_cpus": i["num_cpus"]}
             for i in infos if i["node_id"] == ctx.node_id]
    result = setup_numa(guard.numa, ctx.local_rank, peers)
    ctx.numa_node = result.numa_node
    ctx.cpu_affinity = tuple(result.cpu_affinity)


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


class GuardedTrainFn:
    """The function Ray Train runs in each worker: rayguard's set-up, then the user's loop."""

    def __init__(self, inner: Callable[[], Any], guard: GuardConfig, coordinator: Any,
                 run_dir: str) -> None:
        self.inner = inner
        self.guard = guard
        self.coordinator = coordinator
        self.run_dir = run_dir

    def __call__(self) -> Any:
        session = self._set_up()
        try:
            try:
                result = self.inner()
                session.finish()  # the checkpoint in flight commits (or raises) first
            except BaseException as exc:
                session.settle()
                set_active(False)
                session.watchdog.stop()
                session._flush_quietly(timeout_s=5)  # keep what was reported before the error
                session.report_failure(exc)
                raise
            set_active(False)
            session.close()
            set_context(None)
            return result
        finally:
            session.unwatch()
            if session.ray_bridge is not None:
                ray_report.uninstall(session.ray_bridge)

    def _set_up(self) -> WorkerSession:
        import ray

        from rayguard.logs import configure_logging, quiet_ray_reports

        configure_logging()
        quiet_ray_reports()

        attempt = ray.get(self.coordinator.attempt.remote()) if self.coordinator else 0
        ctx = _base_context(self.run_dir, attempt)
        check_rank_env(dict(os.environ), ctx)
        faults = parse_faults(";".join(filter(None, [self.guard.faults,
                                                     os.environ.get(FAULTS_ENV_VAR)])))
        session = WorkerSession(ctx, self.guard, self.coordinator, faults)
        session.use_store(_store(ctx.run_dir))
        session.start()  # the watchdog covers set-up too (floor covers start-up)
        try:
            _preflight(ctx, self.guard)
        except Exception as exc:
            session.record("preflight_error", str(exc), wait=True)
            raise
        previous = previous_assignment(session)  # every rank reads it before rank 0 replaces it
        infos = session.gather("setup", _worker_info(ctx))
        _bind_numa(ctx, self.guard, infos)
        _pin_cuda(ctx, infos)
        if self.guard.seed is not None:
            ctx.seed = rank_seed(self.guard.seed, ctx.rank)
            seed_everything(ctx.seed, deterministic=self.guard.deterministic)
        register_serializers(self.guard)
        apply_elastic(ctx, self.guard, session, infos, previous)
        session.agreement = make_agreement(ctx.world_size, session.gather, session.heartbeat)
        watch_preemption(session)
        set_context(ctx)
        _set_current_session(session)
        session.ray_bridge = ray_report.install(session)  # every ray.train.report is guarded
        if ctx.rank == 0:
            session.record("attempt_started", f"attempt {attempt} started with {ctx.world_size} worker(s)",
                           world_size=ctx.world_size)
        return session


_SESSION: WorkerSession | None = None


def _set_current_session(session: WorkerSession | None) -> None:
    global _SESSION
    _SESSION = session


def current_session() -> WorkerSession | None:
    return _SESSION
