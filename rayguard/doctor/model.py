"""Model preflight at the first report: mistakes that train without error but wrongly.

Pure: the checks read :class:`ModelFacts`, one per rank, collected by
:mod:`rayguard.train.model_preflight` and gathered once. They only warn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rayguard.doctor.findings import Finding

FULL_STATE_WARN_BYTES = 64 * 1024**2
"""Identical plain ``state=`` tensors on every rank above this size are worth a warning."""


@dataclass(frozen=True)
class ModelFacts:
    """What one rank's first report shows (small, picklable)."""

    unsynced_batchnorm: tuple[str, ...] = ()
    """Names of BatchNorm modules that are not SyncBatchNorm, in the models of ``sharded=``."""
    replicated_fingerprint: str | None = None
    """A digest of the non-DTensor parameters of those models (None: none)."""
    state_signature: str | None = None
    """Names, shapes and dtypes of the plain ``state=`` tensors (None: no state)."""
    state_bytes: int = 0
    sharded_model: bool = False
    """A model of ``sharded=`` holds DTensor (FSDP2 / tensor-parallel) parameters."""


def check_model(facts: Sequence[ModelFacts], *,
                full_state_warn_bytes: int = FULL_STATE_WARN_BYTES) -> list[Finding]:
    """Every finding for a run of ``len(facts)`` ranks (none for a single rank)."""
    if len(facts) < 2:
        return []
    return [*_batchnorm(facts), *_params_differ(facts), *_full_state(facts, full_state_warn_bytes)]


def _batchnorm(facts: Sequence[ModelFacts]) -> list[Finding]:
    names = sorted({n for f in facts for n in f.unsynced_batchnorm})
    if not names:
        return []
    return [Finding(
        "MODEL_BATCHNORM_NOT_SYNCED", "warning", "BatchNorm",
        f"{len(facts)} data-parallel ranks each normalise with their own batch's statistics in "
        f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''} (not SyncBatchNorm), so the "
        "running statistics differ from one rank to the next and from a single-process run",
        "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping it in "
        "DDP/fully_shard (or keep per-rank statistics on purpose)")]


def _params_differ(facts: Sequence[ModelFacts]) -> list[Finding]:
    prints = [f.replicated_fingerprint for f in facts]
    if any(p is None for p in prints) or len(set(prints)) == 1:
        return []
    groups: dict[str | None, list[int]] = {}
    for rank, p in enumerate(prints):
        groups.setdefault(p, []).append(rank)
    split = "; ".join(f"ranks {ranks}" for ranks in groups.values())
    return [Finding(
        "MODEL_PARAMS_DIFFER", "warning", "parameters",
        f"the replicated (non-sharded) parameters differ across ranks at the first report "
        f"({split} agree among themselves): each rank trains its own model",
        "build the model after seeding it identically on every rank (torch.manual_seed(s) "
        "with the same s; rayguard seeds every rank differently), or wrap it in "
        "DistributedDataParallel, which broadcasts rank 0's parameters")]


def _full_state(facts: Sequence[ModelFacts], warn_bytes: int) -> list[Finding]:
    sigs = {f.state_signature for f in facts}
    if len(sigs) != 1 or None in sigs or min(f.state_bytes for f in facts) < warn_bytes:
        return []
    mib = facts[0].state_bytes / 2**20
    fsdp = " of an FSDP model" if any(f.sharded_model for f in facts) else ""
    return [Finding(
        "STATE_FULL_ON_EVERY_RANK", "warning", "state=",
        f"every one of {len(facts)} ranks passed the same {mib:.0f} MiB of tensors in state= "
        f"(a full state dict{fsdp} gathered on every rank: {len(facts)}x the memory and the "
        "bytes written)",
        "pass the model and optimizer as sharded={'model': model, 'optim': opt} (each rank "
        "writes only its shards), or gather with StateDictOptions(full_state_dict=True, "
        "cpu_offload=True) (only rank 0 holds it) and pass state= on rank 0 only")]
