"""Which nodes to fence off (pure): a node whose workers keep failing is quarantined.

Input: the node failures of a run (:class:`NodeFailure`: node id, attempt, reason), the
nodes already quarantined, and when a person lifted a node's quarantine. Output: a
:class:`QuarantineDecision` naming the nodes to quarantine now, each with its reason and the
failures counted. A node is quarantined once failures on it ended ``quarantine_after``
distinct attempts (counted per attempt, not per worker: two workers dying on one node in one
attempt count once). A ``straggler`` reason quarantines at once: the eviction rule
(:class:`~rayguard.health.eviction.StragglerEviction`) already waited its duration.

Who feeds it: the controller, with :func:`node_failure_reason` over each worker's classified
failure (a survivor's collateral error, an error of the training function, a NaN or a
preemption never counts against a node); the straggler eviction; and, later, a diagnosed
hang's culprit (reason ``hang_culprit``) through the coordinator's ``record_node_failures``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayguard.failures.patterns import reads_as_collateral
from rayguard.failures.taxonomy import Failure

REASONS = ("killed", "oom", "cuda", "hang_culprit", "preflight", "straggler")
"""Why a failure counts against its node. ``killed``: the worker process died (killed by the
OS, a segfault); ``oom``: out of memory; ``cuda``: a CUDA or NCCL error of the rank's own
device; ``hang_culprit``: a diagnosed hang named the rank as the one the others waited for;
``preflight``: the node failed rayguard's preflight checks; ``straggler``: the rank was a
straggler for ``HealthConfig.straggler_evict_after_s`` (elastic runs)."""

IMMEDIATE = frozenset({"straggler"})
"""Reasons that quarantine at the first failure (their rule already waited)."""

_CUDA_TEXT = ("cuda error", "cudaerror", "cublas_status", "cudnn_status", "nccl error",
              "ncclunhandledcudaerror", "ecc error", "xid", "an illegal memory access")


@dataclass(frozen=True)
class NodeFailure:
    """One failure counted against a node."""

    node: str
    """The node's Ray id (hex)."""
    attempt: int
    """The attempt it ended (0: the first start)."""
    reason: str
    """One of :data:`REASONS`."""
    rank: int | None = None
    detail: str = ""
    """One line: what happened."""

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "attempt": self.attempt, "reason": self.reason,
                "rank": self.rank, "detail": self.detail[:300]}


@dataclass(frozen=True)
class Quarantined:
    """A node to leave out of every later worker group of the run (and the run directory)."""

    node: str
    reason: str
    """The reason of its latest counted failure."""
    failures: tuple[NodeFailure, ...]
    """The failures counted (one per attempt)."""

    @property
    def attempts(self) -> tuple[int, ...]:
        return tuple(f.attempt for f in self.failures)

    def describe(self, run_dir: str = "RUN_DIR") -> str:
        return (f"node {self.node[:12]} quarantined ({self.reason}): failures in attempt(s) "
                f"{', '.join(map(str, self.attempts))}; later worker groups leave it out "
                f"(lift: rayguard quarantine lift {run_dir} {self.node[:12]})")


@dataclass(frozen=True)
class QuarantineDecision:
    """What :func:`plan_quarantine` decided."""

    new: tuple[Quarantined, ...] = ()
    """Nodes to quarantine now, sorted by node id."""
    excluded: frozenset[str] = field(default_factory=frozenset)
    """Every node left out from now on (the ones already quarantined and the new ones)."""
    withheld: tuple[Quarantined, ...] = ()
    """Nodes that met the rule but are the cluster's only node: there is nowhere to fence
    them from (a single-machine run continues there), so they are not quarantined."""


def node_failure_reason(failure: Failure) -> str | None:
    """The :data:`REASONS` entry a classified worker failure counts as against the worker's
    node, or ``None`` when it says nothing about the node: an error of the training function,
    a NaN, a hang seen by the rank's own watchdog (every rank of a collective hang looks
    stuck; the culprit comes from a diagnosis), a preemption, a bad config, and any error
    that reads as the consequence of a peer's loss (the survivor's node is fine)."""
    if reads_as_collateral(failure.error_type, failure.summary):
        return None
    if failure.cause == "preflight":
        return "preflight"
    if failure.cause == "oom":
        return "oom"
    if failure.cause == "kill" and failure.label != "injected kill":
        return "killed"
    if failure.cause in ("error", "unknown"):
        text = f"{failure.summary} {failure.details[:2000]}".lower()
        if any(p in text for p in _CUDA_TEXT):
            return "cuda"
    return None


def plan_quarantine(failures: Iterable[NodeFailure], quarantine_after: int | None,
                    quarantined: Iterable[str] = (),
                    lifted: Mapping[str, int] | None = None,
                    nodes_alive: int | None = None) -> QuarantineDecision:
    """Nodes to quarantine given every node failure of the run so far.

    ``quarantine_after``: distinct attempts with a counted failure that quarantine a node
    (``None``: never, straggler evictions included). ``quarantined``: nodes left out already
    (never decided again). ``lifted``: node -> the last attempt whose failures no longer
    count (a person lifted the quarantine after it; only later failures count again).
    ``nodes_alive``: nodes in the cluster now; with one, nothing is quarantined (the node
    is returned in ``withheld``).
    """
    already = frozenset(quarantined)
    if quarantine_after is None:
        return QuarantineDecision(excluded=already)
    lifted = dict(lifted or {})
    per_node: dict[str, dict[int, NodeFailure]] = {}
    for f in failures:
        if f.node in already or f.attempt <= lifted.get(f.node, -1) or f.reason not in REASONS:
            continue
        per_attempt = per_node.setdefault(f.node, {})
        per_attempt.setdefault(f.attempt, f)  # counted per attempt, not per worker
    new = []
    for node in sorted(per_node):
        counted = tuple(per_node[node][a] for a in sorted(per_node[node]))
        immediate = any(f.reason in IMMEDIATE for f in counted)
        if immediate or len(counted) >= quarantine_after:
            new.append(Quarantined(node, counted[-1].reason, counted))
    if nodes_alive is not None and nodes_alive <= 1:
        return QuarantineDecision(excluded=already, withheld=tuple(new))
    return QuarantineDecision(tuple(new), already | {q.node for q in new})


@dataclass(frozen=True)
class FenceDecision:
    """What :func:`fence_nodes` decided: the nodes to leave out, and the file's entries not
    applied."""

    fenced: frozenset[str] = frozenset()
    withheld: frozenset[str] = frozenset()
    """Alive nodes only the file named, not fenced: with them every alive node would be."""


def fence_nodes(own: Collection[str], from_file: Collection[str],
                alive: Collection[str] | None) -> FenceDecision:
    """The nodes the next worker group leaves out: the ones this run's rule quarantined
    (``own``, decided by :func:`plan_quarantine`, which never fences the only node) and the
    quarantine file's (``from_file``: an earlier run's, or anyone's who can write the run
    directory). The file never fences every alive node (``alive``; ``None``: not known): when
    together they would, the file's entries on alive nodes are withheld, as
    :func:`plan_quarantine` withholds a cluster's only node."""
    mine, theirs = frozenset(own), frozenset(from_file) - frozenset(own)
    everything = mine | theirs
    if not alive or not frozenset(alive) <= everything:
        return FenceDecision(everything)
    withheld = theirs & frozenset(alive)
    return FenceDecision(everything - withheld, withheld)
