"""GuardConfig: everything rayguard does around the user's training loop, validated.

Per-capability settings are nested configs (``health=HealthConfig(...)``) so that the top
level stays a short list of switches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayguard.exceptions import config_error, strict_fields
from rayguard.health.config import HealthConfig

NumaMode = Literal["auto", "strict", "off"]
RecoveryMode = Literal["restart", "live"]
LrScaling = Literal["none", "linear", "sqrt"]
CheckpointMode = Literal["sync", "async"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


@strict_fields
@dataclass(frozen=True)
class CheckpointConfig:
    """``GuardConfig(checkpoint=CheckpointConfig(...))``."""

    mode: CheckpointMode = "sync"
    """``"sync"``: ``report(state=...)`` returns once the checkpoint is committed (or raises).
    ``"async"``: it returns once this rank's state is snapshotted into host memory; hashing,
    writing, fsync, the gather and the commit run in the background (at most one in flight),
    and a background failure is raised at the next ``report`` or when the function returns."""

    memory_tier: bool = False
    """Also keep the newest committed checkpoint in Ray's object store, owned by the run's
    coordinator (one snapshot per rank, freed when a newer one commits): after a worker
    process crash, ``load_state()`` reads it from memory when it verifies, else from disk."""

    memory_peer_copy: bool = True
    """``memory_tier=True``: also have one peer node keep each rank's snapshot (the next
    node in sorted node-id order), copied in the background, so that one node's loss still
    restores from memory. ``False``: the own node's copy only (a lost node's ranks read the
    disk), and no background copy competing with the loop for CPU and network
    (``tests/benchmarks/bench_peer_restore.py`` measures both)."""

    pin_memory: bool = True
    """``mode="async"``: snapshot CUDA tensors into pinned (page-locked) host buffers with
    non-blocking copies (fast, but the pages cannot be swapped); ``False``: pageable
    buffers and blocking copies."""

    finish_timeout_s: float = 1800.0
    """``mode="async"``: how long a worker waits, when the training function returns, for the
    checkpoint still persisting (``fit()`` returns only after it committed); past it the
    attempt fails with a CheckpointError. Also bounds the wait for it when the function
    raises (then the error is the function's)."""

    interval: bool = True
    """``rayguard.train.should_checkpoint()`` also turns True when the Young/Daly interval
    (from the measured checkpoint cost and the run's failure rate) has passed since the last
    checkpoint; ``False``: it answers preemption notices only. On by default: only loops that
    call ``should_checkpoint()`` are affected, and for them it is the point."""

    mtbf_s: float | None = None
    """The prior mean time between failures, in seconds, that the failures seen in this run
    directory refine (weighted as 1/20 of a failure: a few observed failures outweigh it).
    ``None``: 24 h, a conservative prior (a long interval, few checkpoints) until the run
    shows its own failure rate."""

    min_interval_s: float = 60.0
    """The shortest interval the policy asks for: below a minute the checkpoint traffic of a
    large model rarely pays off, and a very cheap or mis-measured cost cannot make every
    step a checkpoint. Also the first interval, before any checkpoint cost was measured."""

    max_interval_s: float = 3600.0
    """The longest interval the policy asks for: at most an hour of work is lost to one
    failure even when no failure was seen yet (the 24 h prior alone asks for more)."""

    hash: Literal["blake3", "sha256"] = "blake3"
    """The digest new checkpoints record for every file (16 MiB chunks either way):
    ``"blake3"`` (about 4x sha256's speed per core) or ``"sha256"`` (where a FIPS-approved
    function is required). Loading accepts both, whatever this says."""

    key_file: str | None = None
    """A file holding a secret checkpoint key (at least 16 bytes, e.g. ``openssl rand -hex
    32``), on every node and outside the checkpoint storage: every manifest written is then
    signed with a keyed digest (BLAKE3's keyed mode, or HMAC-SHA256 with ``hash="sha256"``),
    and only checkpoints signed with this key are loaded or offered; one resealed by someone
    without the key is rejected, and so is one with no manifest. ``None``: the file named
    by ``RAYGUARD_CHECKPOINT_KEY_FILE`` where set, else no key (integrity only)."""

    accept_unsealed: bool = True
    """Whether ``ray.train.get_checkpoint()`` may offer a reported checkpoint that carries no
    manifest at all (one reported before rayguard guarded the loop), with a warning. Never
    one the run's log records as committed, nor one newer than a checkpoint the run sealed:
    those are rejected. ``False``: an unsealed checkpoint is always rejected (so is every
    one when a key is set)."""

    def __post_init__(self) -> None:
        self._check_interval()
        self._check_key()
        if self.hash not in ("blake3", "sha256"):
            raise config_error("CheckpointConfig", "hash", self.hash,
                               'must be "blake3" or "sha256"',
                               'pass hash="blake3" (fast, the default) or hash="sha256" (FIPS)')
        if self.mode not in ("sync", "async"):
            raise config_error("CheckpointConfig", "mode", self.mode, 'must be "sync" or "async"',
                               'pass mode="async" (snapshot, then persist in the background) '
                               'or mode="sync"')
        if not isinstance(self.memory_tier, bool):
            raise config_error("CheckpointConfig", "memory_tier", self.memory_tier,
                               "must be a bool", "pass memory_tier=True or False")
        if not isinstance(self.memory_peer_copy, bool):
            raise config_error("CheckpointConfig", "memory_peer_copy", self.memory_peer_copy,
                               "must be a bool", "pass memory_peer_copy=False to keep no copy "
                               "on a peer node")
        if not isinstance(self.pin_memory, bool):
            raise config_error("CheckpointConfig", "pin_memory", self.pin_memory,
                               "must be a bool", "pass pin_memory=True or False")
        if (not isinstance(self.finish_timeout_s, (int, float)) or isinstance(self.finish_timeout_s, bool)
                or not self.finish_timeout_s > 0):
            raise config_error("CheckpointConfig", "finish_timeout_s", self.finish_timeout_s,
                               "must be a number of seconds > 0",
                               "pass the longest a checkpoint may take to persist, e.g. 1800")

    def _check_key(self) -> None:
        if self.key_file is not None and not (isinstance(self.key_file, str) and self.key_file):
            raise config_error("CheckpointConfig", "key_file", self.key_file,
                               "must be a path (str) or None",
                               'pass key_file="/etc/rayguard/checkpoint.key" (a file on every '
                               "node, outside the checkpoint storage)")
        if not isinstance(self.accept_unsealed, bool):
            raise config_error("CheckpointConfig", "accept_unsealed", self.accept_unsealed,
                               "must be a bool", "pass accept_unsealed=False to reject every "
                               "reported checkpoint without a manifest")

    def _check_interval(self) -> None:
        if not isinstance(self.interval, bool):
            raise config_error("CheckpointConfig", "interval", self.interval, "must be a bool",
                               "pass interval=True (checkpoint at the Young/Daly interval "
                               "where the loop asks should_checkpoint()) or False")
        if self.mtbf_s is not None and not (_is_number(self.mtbf_s) and self.mtbf_s > 0):
            raise config_error("CheckpointConfig", "mtbf_s", self.mtbf_s,
                               "must be a number of seconds > 0 or None",
                               "pass the expected time between failures, e.g. mtbf_s=86400, "
                               "or None to learn it from the run")
        for name in ("min_interval_s", "max_interval_s"):
            value = getattr(self, name)
            if not (_is_number(value) and 0 <= value < float("inf")):
                raise config_error("CheckpointConfig", name, value,
                                   "must be a finite number of seconds >= 0",
                                   f"pass e.g. {name}={60 if name.startswith('min') else 3600}")
        if self.min_interval_s > self.max_interval_s:
            raise config_error("CheckpointConfig", "min_interval_s", self.min_interval_s,
                               f"must be <= max_interval_s={self.max_interval_s!r}",
                               "lower min_interval_s or raise max_interval_s")


@strict_fields
@dataclass(frozen=True)
class GuardConfig:
    """What rayguard sets up in each worker and watches during a run."""

    seed: int | None = 0
    """Base seed. Rank ``r`` seeds ``random``, ``numpy`` and ``torch`` with a distinct,
    reproducible seed derived from ``(seed, r)`` (``ctx.seed``). ``None``: no seeding."""

    deterministic: bool = False
    """Also call ``torch.use_deterministic_algorithms(True)`` (and the cuDNN/cuBLAS settings it
    needs), so that a run repeats bit for bit on the same hardware."""

    health: HealthConfig = field(default_factory=HealthConfig)
    """Progress watchdog, NaN/inf guard and restart budget."""

    numa: NumaMode = "auto"
    """CPU/memory binding to the GPU's NUMA node: ``"auto"`` binds where it can and logs it,
    ``"strict"`` fails the start when binding is impossible, ``"off"`` binds nothing."""

    global_batch_size: int | None = None
    """Samples per optimizer step across all ranks; kept constant when the world size changes
    (``ctx.grad_accum_steps`` absorbs the change). ``None``: no batch geometry."""

    micro_batch_size: int | None = None
    """Samples per forward/backward on one rank (required with ``global_batch_size``)."""

    lr_scaling: LrScaling = "none"
    """Learning-rate rule when the world size changes: ``none``, ``linear`` or ``sqrt``."""

    preflight: bool = True
    """Run the per-worker subset of ``rayguard doctor`` at worker start-up; an ``error``
    finding stops the run at once with its message."""

    serializers: bool = True
    """Register rayguard's tensor serializers in the driver and every worker."""

    faults: str | None = None
    """Fault-injection spec (see :mod:`rayguard.testing`); ``RAYGUARD_FAULTS`` is read too."""

    controller_poll_interval_s: float = 0.05
    """Ray Train controller poll interval. Ray's default (2 s) makes every
    ``ray.train.report`` wait up to 2 s; a value the user sets in
    ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` wins."""

    progress_interval_s: float | None = 5.0
    """The driver prints a progress line (step, loss, steps/s, attempt, workers, last
    checkpoint) at most this often while ``fit()`` runs, and one line per restart, stall, NaN
    or rejected checkpoint as it happens. ``None``: print nothing."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """How ``report(state=...)`` persists: ``CheckpointConfig(mode="sync"|"async",
    memory_tier=...)``."""

    recovery: RecoveryMode = "live"
    """How a failure is recovered. ``"live"`` (default): a failed worker of a group of 2 or
    more on Ray's ``TorchConfig`` is replaced alone while the others keep their processes and
    rejoin (elsewhere, a one-worker run or another backend, the worker group restarts); an
    elastic run whose node is lost or returns is resized in place where it can be, the
    workers that stay keeping their processes (docs/elastic.md); a NaN/inf
    (``nan_policy="restart"``) makes every rank agree at that report and re-enter the
    training function in its own process from the last committed checkpoint (memory tier or
    disk), in ``rayguard.train.report`` and ``ray.train.report`` loops alike; where a live
    recovery cannot be made (a second worker dead, a replacement that fails before its first
    commit, ...) the whole group restarts once, and the ``restart`` event says why.
    ``"restart"``: Ray Train restarts the whole worker group at every failure. Either is
    counted like a restart (``FailureConfig(max_failures)``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, CheckpointConfig):
            raise config_error("GuardConfig", "checkpoint", self.checkpoint,
                               "must be a rayguard.CheckpointConfig",
                               'pass checkpoint=rayguard.CheckpointConfig(mode="async")')
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < 2**63):
            raise config_error("GuardConfig", "seed", self.seed, "must be an int in [0, 2**63) or None",
                               "pass e.g. seed=0, or seed=None to leave RNGs alone")
        if not isinstance(self.deterministic, bool):
            raise config_error("GuardConfig", "deterministic", self.deterministic, "must be a bool",
                               "pass deterministic=True or False")
        if not isinstance(self.health, HealthConfig):
            raise config_error("GuardConfig", "health", self.health, "must be a rayguard.HealthConfig",
                               "pass health=rayguard.HealthConfig(...)")
        if self.recovery not in ("restart", "live"):
            raise config_error("GuardConfig", "recovery", self.recovery,
                               'must be "restart" or "live"', 'pass recovery="live" (the default) or "restart"')
        if self.numa not in ("auto", "strict", "off"):
            raise config_error("GuardConfig", "numa", self.numa, 'must be "auto", "strict" or "off"',
                               'pass numa="auto"')
        self._check_batch_geometry()
        if self.lr_scaling not in ("none", "linear", "sqrt"):
            raise config_error("GuardConfig", "lr_scaling", self.lr_scaling,
                               'must be "none", "linear" or "sqrt"', 'pass lr_scaling="none"')
        for name in ("preflight", "serializers"):
            if not isinstance(getattr(self, name), bool):
                raise config_error("GuardConfig", name, getattr(self, name), "must be a bool",
                                   f"pass {name}=True or False")
        if self.faults is not None:
            from rayguard.faults.spec import parse_faults

            parse_faults(self.faults)  # raises FaultSpecError naming the bad part
        if not (isinstance(self.controller_poll_interval_s, (int, float))
                and 0 < self.controller_poll_interval_s <= 60):
            raise config_error("GuardConfig", "controller_poll_interval_s",
                               self.controller_poll_interval_s, "must be in (0, 60] seconds",
                               "pass e.g. controller_poll_interval_s=0.05")

        if self.progress_interval_s is not None and not (
                isinstance(self.progress_interval_s, (int, float))
                and not isinstance(self.progress_interval_s, bool)
                and 0 < self.progress_interval_s <= 3600):
            raise config_error("GuardConfig", "progress_interval_s", self.progress_interval_s,
                               "must be in (0, 3600] seconds or None",
                               "pass e.g. progress_interval_s=5, or None for no progress line")

    def _check_batch_geometry(self) -> None:
        g, m = self.global_batch_size, self.micro_batch_size
        for name, value in (("global_batch_size", g), ("micro_batch_size", m)):
            if value is not None and not (_is_int(value) and value > 0):
                raise config_error("GuardConfig", name, value, "must be an int > 0 or None",
                                   f"pass e.g. {name}=64")
        if (g is None) != (m is None):
            missing = "micro_batch_size" if m is None else "global_batch_size"
            raise config_error("GuardConfig", missing, None,
                               "global_batch_size and micro_batch_size go together",
                               f"set {missing} too, or neither")
        if g is not None and m is not None and g % m:
            raise config_error("GuardConfig", "global_batch_size", g,
                               f"must be a multiple of micro_batch_size={m}",
                               f"use e.g. global_batch_size={max(m, g // m * m)}")
