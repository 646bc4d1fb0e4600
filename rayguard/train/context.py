"""GuardContext: what a training function learns from ``rayguard.train.get_context()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayguard import runtime
from rayguard.exceptions import RayGuardError


@dataclass
class GuardContext:
    """The worker's place in the run, as rayguard set it up."""

    rank: int
    """World rank of this worker."""
    local_rank: int
    """Rank among the workers on this node."""
    world_size: int
    local_world_size: int
    node_rank: int
    node_id: str
    """Ray node id of this worker's node."""
    device: Any
    """``torch.device`` this worker's CUDA work goes to (``cpu`` on CPU workers)."""
    seed: int | None
    """This rank's seed (``None`` when seeding is off)."""
    attempt: int
    """0 for the first start of the worker group, +1 at every restart."""
    run_dir: str
    """The run directory (``Result.path``): checkpoints and the event log live here."""
    gpu_ids: tuple[str, ...] = ()
    numa_node: int | None = None
    """NUMA node this worker's CPU threads and memory are bound to (``None``: unbound)."""
    cpu_affinity: tuple[int, ...] = ()
    """CPUs this worker may run on."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step so that micro x accumulation x world = global."""
    previous_rank: int | None = None
    """This worker's rank in the previous attempt (``None``: new worker or first attempt)."""
    world_size_changed: bool = False
    """True when this attempt runs with a different world size than the previous one."""
    data_skip_steps: int = 0
    """After ``load_state()`` restored a checkpoint from before a divergence
    (``HealthConfig(divergence=...)``): optimizer steps of data to leave out, those that
    diverged. ``ElasticSampler.load_state_dict`` leaves them out by itself; a loop with its
    own data order skips as many batches. 0: none."""
    extras: dict[str, Any] = field(default_factory=dict)


def set_context(ctx: GuardContext | None) -> None:
    """Set-up: this worker's context (its runtime's)."""
    runtime.current().context = ctx


def get_context() -> GuardContext:
    """The current worker's :class:`GuardContext`."""
    ctx = runtime.current().context
    if ctx is None:
        raise RayGuardError(
            "rayguard.train.get_context() was called outside a rayguard worker. Fix: call it "
            "inside the training function passed to rayguard.RobustTrainer."
        )
    return ctx
