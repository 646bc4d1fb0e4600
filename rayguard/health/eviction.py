"""Straggler eviction (pure): a rank that stays a straggler long enough gets its node left out.

Fed with every rank's straggler score after each step summary (the run's coordinator, from
:class:`~rayguard.observe.straggler.StragglerDetector`), :class:`StragglerEviction` tracks
since when each rank has been flagged without a break: flagged by the detector (observed for
a whole window) and its score still at or above the threshold. Once that lasted
``evict_after_s``, it returns the rank's node once, as a ``straggler``
:class:`~rayguard.health.quarantine.NodeFailure`; the quarantine then leaves the node out at
the next resize of the elastic run. A score that drops below the threshold resets the clock;
a new attempt starts afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rayguard.health.quarantine import NodeFailure


@dataclass(frozen=True)
class RankScore:
    """One rank's straggler state, as the detector sees it now."""

    score: float | None
    """Its mean step time / its peers' median (``None``: no peers yet)."""
    flagged: bool
    """The detector has flagged it (a straggler verdict was emitted this attempt)."""
    node: str | None


class StragglerEviction:
    def __init__(self, evict_after_s: float, threshold: float) -> None:
        self.evict_after_s = evict_after_s
        self.threshold = threshold
        self._attempt: int | None = None
        self._since: dict[int, float] = {}
        self._evicted: set[str] = set()

    def observe(self, attempt: int, now: float,
                ranks: Mapping[int, RankScore]) -> list[NodeFailure]:
        """Account the scores at ``now``; returns the nodes to evict now (each once)."""
        if attempt != self._attempt:
            self._attempt, self._since = attempt, {}
        out = []
        for rank, state in sorted(ranks.items()):
            over = (state.flagged and state.score is not None and state.score >= self.threshold
                    and state.node is not None)
            if not over:
                self._since.pop(rank, None)
                continue
            since = self._since.setdefault(rank, now)
            if now - since >= self.evict_after_s and state.node not in self._evicted:
                self._evicted.add(str(state.node))
                out.append(NodeFailure(
                    str(state.node), attempt, "straggler", rank,
                    f"rank {rank} was a straggler ({state.score:.2f}x its peers' median step) "
                    f"for {now - since:.0f} s >= straggler_evict_after_s={self.evict_after_s:g}"))
        return out
