"""CUDA context pinning: which CUDA ordinal a worker must use, derived from the GPU ids Ray
assigned to *this* actor and the ``CUDA_VISIBLE_DEVICES`` the process sees.

Never ``local_rank`` arithmetic: under Ray, a worker's GPUs need not be the ``local_rank``-th
visible device (Ray Train shares every local worker's GPUs in ``CUDA_VISIBLE_DEVICES`` so
that NCCL can use peer-to-peer, and the order of actors on a node is Ray's, not ours).

``CUDA_VISIBLE_DEVICES`` is read by :mod:`rayguard.placement.visible_devices` (the parser
the doctor uses too). Everything here is pure; :func:`rayguard.train.setup` applies the
result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rayguard.exceptions import WorkerSetupError
from rayguard.placement.visible_devices import duplicate_keys, visible_ids


@dataclass(frozen=True)
class CudaPlacement:
    """Where a worker's CUDA work goes. ``ordinal`` is ``None`` for a CPU worker."""

    ordinal: int | None
    """The CUDA ordinal (index into the visible devices) for ``torch.cuda.set_device``."""

    ordinals: tuple[int, ...] = ()
    """All ordinals of the GPUs assigned to this worker, primary first."""

    gpu_ids: tuple[str, ...] = ()
    """The GPU ids Ray assigned to this actor, as Ray reports them."""

    @property
    def device(self) -> str:
        return "cpu" if self.ordinal is None else f"cuda:{self.ordinal}"


def _where(rank: int | None, node: str | None) -> str:
    return f"rank {rank if rank is not None else '?'} on node {node or '?'}"


def resolve_cuda_device(
    gpu_ids: Sequence[str | int],
    visible_devices: str | None,
    device_count: int,
    *,
    rank: int | None = None,
    node: str | None = None,
) -> CudaPlacement:
    """Map the GPU ids Ray assigned to this worker onto CUDA ordinals.

    ``gpu_ids``: what ``ray.get_gpu_ids()`` returns in the worker (empty: a CPU worker).
    ``visible_devices``: the worker's ``CUDA_VISIBLE_DEVICES`` (``None`` if unset).
    ``device_count``: ``torch.cuda.device_count()`` in the worker.

    Raises :class:`WorkerSetupError` naming the rank, node, ids and fix when the ids cannot be
    mapped: duplicates in ``CUDA_VISIBLE_DEVICES``, an assigned id not visible, an ordinal
    out of range.
    """
    ids = tuple(str(g) for g in gpu_ids)
    if not ids:
        return CudaPlacement(ordinal=None)
    where = _where(rank, node)
    if len(set(ids)) != len(ids):
        raise WorkerSetupError(
            f"{where}: Ray assigned duplicate GPU ids {list(ids)}. Fix: check the node's "
            "CUDA_VISIBLE_DEVICES at `ray start` (each GPU listed once) and the resources "
            "Ray advertises (`ray status`)."
        )
    visible = visible_ids(visible_devices)
    if visible is None:
        ordinals = _ordinals_all_visible(ids, device_count, where)
    else:
        ordinals = _ordinals_from_visible(ids, visible, where)
    for ordinal in ordinals:
        if not 0 <= ordinal < device_count:
            raise WorkerSetupError(
                f"{where}: GPU ids {list(ids)} map to CUDA ordinal {ordinal}, but this "
                f"process sees {device_count} CUDA device(s) (CUDA_VISIBLE_DEVICES="
                f"{visible_devices!r}). Fix: make CUDA_VISIBLE_DEVICES list only GPUs that "
                "exist on the node, and do not override it in runtime_env env_vars."
            )
    return CudaPlacement(ordinal=ordinals[0], ordinals=tuple(ordinals), gpu_ids=ids)


def _ordinals_all_visible(ids: tuple[str, ...], device_count: int, where: str) -> list[int]:
    ordinals = []
    for gid in ids:
        if not gid.isdigit():
            raise WorkerSetupError(
                f"{where}: Ray assigned GPU id {gid!r}, but CUDA_VISIBLE_DEVICES is unset, so "
                "only integer ids can be mapped. Fix: start Ray with CUDA_VISIBLE_DEVICES "
                "listing the node's GPUs (integers, UUIDs or MIG ids), or leave Ray's own "
                "CUDA_VISIBLE_DEVICES handling on."
            )
        ordinals.append(int(gid))
    return ordinals


def _ordinals_from_visible(ids: tuple[str, ...], visible: list[str], where: str) -> list[int]:
    dupes = duplicate_keys(visible)
    if dupes:
        raise WorkerSetupError(
            f"{where}: CUDA_VISIBLE_DEVICES={','.join(visible)!r} lists {dupes} more than "
            "once, so two ordinals would name one GPU. Fix: list each GPU once."
        )
    position = {entry: i for i, entry in enumerate(visible)}
    missing = [gid for gid in ids if gid not in position]
    if missing:
        raise WorkerSetupError(
            f"{where}: Ray assigned GPU ids {list(ids)} but {missing} are not in this "
            f"process's CUDA_VISIBLE_DEVICES={','.join(visible)!r}. Fix: do not set "
            "CUDA_VISIBLE_DEVICES yourself in the worker (runtime_env env_vars or code before "
            "rayguard's set-up); let Ray set it."
        )
    return [position[gid] for gid in ids]


@dataclass(frozen=True)
class PinnedWorker:
    """One worker's resolved device, as gathered from every worker of a run."""

    rank: int
    node: str
    gpu_ids: tuple[str, ...]
    fractional: bool = False
    """True when Ray gave the worker a fraction of a GPU (sharing is then expected)."""


def check_unique_devices(workers: Sequence[PinnedWorker]) -> None:
    """Two whole-GPU workers on one node must not resolve to the same physical GPU."""
    owner: dict[tuple[str, str], int] = {}
    for w in workers:
        if w.fractional:
            continue
        for gid in w.gpu_ids:
            key = (w.node, gid)
            if key in owner:
                raise WorkerSetupError(
                    f"ranks {owner[key]} and {w.rank} on node {w.node} both resolve to GPU "
                    f"{gid}. Fix: give each worker whole, distinct GPUs (ScalingConfig "
                    "resources_per_worker={'GPU': 1}) or request fractional GPUs explicitly."
                )
            owner[key] = w.rank
