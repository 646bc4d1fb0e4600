"""Per-report agreement between ranks: does this step checkpoint, did a preemption notice come?

Every ``rayguard.train.report`` is a step boundary that all ranks reach in the same order.
Before anything is saved the ranks must agree on four flags (any rank passed ``state=``,
any rank passed ``sharded=``, any rank received a preemption notice, rank 0's interval
policy says a checkpoint is due). The agreement is a MAX all-reduce of four small integers
over a gloo group, the process group the ranks already have (the default group when it is
gloo; one side group created at set-up when the default is NCCL): no actor, no Ray call.
Only when the state or sharded flag is set does the report go on to the checkpoint
protocol, whose intent gather through the run coordinator is unchanged.

A misused ``state=``/``sharded=`` (a DTensor in ``state``, a bad ``sharded`` dict) always
sets the state or sharded flag, so it still reaches the intent gather that raises the same
error on every rank: no flag of its own is needed for it.

Without ``torch.distributed`` (world size 1, or a loop that runs without Ray Train's torch
backend) the flags go through the coordinator's gather (world size > 1: one round trip, as
before) or are this rank's own (world size 1).

Waiting inside the all-reduce counts as progress, as waiting inside a coordinator gather
does: the rank that is really stuck is the one its own watchdog ends, and Ray Train then
restarts the group (a peer that dies closes its gloo connections, so the wait ends).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol


class Flags(NamedTuple):
    """What one rank brings to a report (after agreement: whether any rank brought it)."""

    state: bool = False
    sharded: bool = False
    notice: bool = False
    """A preemption notice arrived (SIGTERM, or Ray's drain information) and has not yet
    been answered with a checkpoint."""
    interval: bool = False
    """Rank 0's checkpoint interval policy says a checkpoint is due
    (:mod:`rayguard.train.pacing`)."""
    nonfinite: bool = False
    """A watched metric is NaN/inf on this rank and ``GuardConfig(recovery="live")``: every
    rank rolls back in place (:mod:`rayguard.train.rollback`)."""

    def merge(self, other: Flags) -> Flags:
        return Flags(*(a or b for a, b in zip(self, other, strict=True)))


def merge_all(flags: list[Flags]) -> Flags:
    out = Flags()
    for f in flags:
        out = out.merge(Flags(*f))
    return out


def needs_protocol(flags: Flags, *, first: bool, world_size: int) -> bool:
    """Whether this report runs the checkpoint protocol (which starts with the intent gather).

    The first report of an attempt at world size > 1 always does: its gather also carries the
    model preflight's facts (once per attempt)."""
    return flags.state or flags.sharded or (first and world_size > 1)


class Agreement(Protocol):
    def agree(self, mine: Flags) -> Flags:
        """Every rank calls it at the same report; all get the same answer."""

    def barrier(self) -> None:
        """Every rank calls it at the same point; returns once all did."""


class LocalAgreement:
    """World size 1: nothing to agree with."""

    def agree(self, mine: Flags) -> Flags:
        return mine

    def barrier(self) -> None:
        return None


class GatherAgreement:
    """No process group: the flags go through ``gather(tag, value)`` (the coordinator)."""

    def __init__(self, gather: Callable[[str, Any], list[Any]]) -> None:
        self._gather = gather
        self._count = 0

    def agree(self, mine: Flags) -> Flags:
        self._count += 1
        return merge_all(self._gather(f"flags{self._count}", tuple(mine)))

    def barrier(self) -> None:
        self._count += 1
        self._gather(f"barrier{self._count}", None)


class CollectiveAgreement:
    """A MAX all-reduce over a gloo group; ``heartbeat`` is called every ``poll_s`` seconds
    while peers are awaited (a wait is not a stall); ``lost``, asked as often, names a peer
    the run says is gone (live recovery's notice): the wait then ends with
    :class:`~rayguard.exceptions.PeersLostError` (gloo cannot abort the collective, and a
    rank that was not the lost one's neighbour may never see a connection close); ``stuck``
    (seconds waited, where) raises once every other rank's training function returned
    (:class:`~rayguard.health.report_wait.ReturnedCheck`)."""

    def __init__(self, group: Any, heartbeat: Callable[[], None], poll_s: float = 1.0,
                 lost: Callable[[], str | None] | None = None,
                 stuck: Callable[[float, str], None] | None = None) -> None:
        import torch

        self._group = group
        self._heartbeat = heartbeat
        self._lost = lost
        self._stuck = stuck
        self._poll = datetime.timedelta(seconds=poll_s)
        self._buffer = torch.zeros(len(Flags._fields), dtype=torch.int32)
        self.calls = 0

    def agree(self, mine: Flags) -> Flags:
        for i, flag in enumerate(mine):
            self._buffer[i] = int(flag)
        self._all_reduce()
        return Flags(*(bool(v) for v in self._buffer.tolist()))

    def barrier(self) -> None:
        self._buffer.zero_()
        self._all_reduce()

    def _all_reduce(self) -> None:
        import torch.distributed as dist

        self.calls += 1
        work = dist.all_reduce(self._buffer, op=dist.ReduceOp.MAX, group=self._group,
                               async_op=True)
        started = time.monotonic()
        while True:
            try:
                work.wait(timeout=self._poll)
                return
            except RuntimeError as exc:  # c10d: the work goes on after a timed-out wait
                if "timed out" not in str(exc).lower():
                    raise
                self._heartbeat()
                if self._stuck is not None:  # every other rank returned: raises
                    self._stuck(time.monotonic() - started, "the ranks' agreement at a report")
                reason = self._lost() if self._lost is not None else None
                if reason:
                    from rayguard.exceptions import PeersLostError

                    raise PeersLostError(reason) from None


def gloo_group_for_flags() -> Any:
    """The group the flags travel on: ``None`` (the default group) when it runs gloo for CPU
    tensors, else a gloo side group. Every rank must call this at the same point (set-up):
    ``new_group`` is itself a collective."""
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if backend == "gloo" or "cpu:gloo" in backend:
        return None
    return dist.new_group(backend="gloo")


def make_agreement(world_size: int, gather: Callable[[str, Any], list[Any]],
                   heartbeat: Callable[[], None],
                   lost: Callable[[], str | None] | None = None,
                   stuck: Callable[[float, str], None] | None = None) -> Agreement:
    """The cheapest agreement this worker can run (see the module docstring); ``lost``,
    ``stuck``: see :class:`CollectiveAgreement`."""
    if world_size == 1:
        return LocalAgreement()
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return GatherAgreement(gather)
    if not (dist.is_available() and dist.is_initialized()):
        return GatherAgreement(gather)
    return CollectiveAgreement(gloo_group_for_flags(), heartbeat, lost=lost, stuck=stuck)
