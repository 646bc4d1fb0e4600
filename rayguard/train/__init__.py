"""What a training function calls inside a RobustTrainer worker.

>>> ctx = rayguard.train.get_context()          # rank, device, seed, attempt, ...
>>> state = rayguard.train.load_state()         # newest verified checkpoint, or None
>>> rayguard.train.report({"loss": loss}, state={"model": model.state_dict(), "step": step})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayguard.exceptions import RayGuardError
from rayguard.train.context import GuardContext, get_context

if TYPE_CHECKING:
    from rayguard.train.session import WorkerSession

__all__ = ["ElasticSampler", "GuardContext", "get_context", "heartbeat", "load_state", "report",
           "should_checkpoint"]


def _session() -> WorkerSession:
    from rayguard.train.session import current_session

    session = current_session()
    if session is None:
        raise RayGuardError(
            "rayguard.train.report/heartbeat/load_state was called outside a rayguard worker. "
            "Fix: call it inside the training function passed to rayguard.RobustTrainer."
        )
    return session


def report(metrics: dict[str, Any], *, state: Any = None, step: int | None = None,
           sharded: dict[str, Any] | None = None) -> None:
    """Report metrics (returns at once; forwarded to ``ray.train.report`` in order) and, with
    ``state`` and/or ``sharded``, take a coordinated, checksum-verified checkpoint.

    ``state``: this rank's state (tensors and plain containers). Ranks that pass ``None``
    write nothing (the DDP case: rank 0 holds the replicated model). DTensors are refused
    here: they go in ``sharded``.
    ``sharded``: FSDP2 / DTensor state, e.g. ``{"model": model, "optim": opt}``, passed by
    every rank; written with torch.distributed.checkpoint (each rank its own shards), every
    file hashed into the same manifest, and reshardable to another world size on load.
    ``step``: the training step (default ``metrics['step']``, ``state['step']``, or one past
    the last report). NaN/inf in the watched metrics raise before anything is saved.
    """
    _session().report(metrics, state=state, step=step, sharded=sharded)


def heartbeat() -> None:
    """Tell the progress watchdog this rank is alive during a long step."""
    _session().heartbeat()


def should_checkpoint() -> bool:
    """True when this step should pass ``state=`` to ``report``, the same value on every rank
    at the same step, so that

    >>> report(metrics, state=state if should_checkpoint() else None)

    is the whole loop change. It turns True, and stays True until a report saves a
    checkpoint, when

    - a preemption notice (SIGTERM to a worker, or a Ray node drain) reached some rank at an
      earlier report: the checkpoint comes just in time;
    - the checkpoint interval that maximises goodput has passed since the last checkpoint:
      Daly's ``sqrt(2 C M)`` (higher-order form) from the measured checkpoint cost ``C`` and
      the run's mean time between failures ``M``, within
      ``CheckpointConfig(min_interval_s, max_interval_s)`` (``interval=False``: preemption
      only). In async mode never while the previous checkpoint still persists.

    Costs nothing: rank 0's decision and the notices ride on each report's agreement. See
    docs/checkpointing.md, "Checkpoint interval by the numbers"."""
    return _session().should_checkpoint()


def load_state(*, sharded: dict[str, Any] | None = None) -> Any:
    """This rank's state from the newest checkpoint that verifies (``None`` on a fresh start).

    Checkpoints that fail verification are skipped with a warning, recorded in the event
    log, and never tried again. RNG states saved with it are restored.

    ``sharded`` (every rank, the same keys as at ``report``): the objects to load the
    sharded part into, in place, resharded to this world size by torch.distributed.checkpoint;
    every file was verified before DCP reads it. The plain part is returned (``{}`` when the
    checkpoint has none); ``None`` still means a fresh start (nothing was loaded).
    """
    return _session().load_state(sharded)


def __getattr__(name: str) -> Any:
    if name == "ElasticSampler":
        from rayguard.elastic import ElasticSampler

        return ElasticSampler
    raise AttributeError(name)
