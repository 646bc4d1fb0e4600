"""Straggler rule (pure; runs in the run's coordinator on the summaries of every rank).

Over a sliding window of ``window_s`` seconds, a rank's mean step time is compared with the
median of its peers' means. Its *straggler score* is that ratio. A rank is a straggler when
its score is at least ``threshold`` and it has been observed for a whole window (one slow
step or a slow start never flags it). The verdict is emitted once when a rank becomes a
straggler; the score is exposed continuously (a metric). A new attempt starts afresh.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StragglerVerdict:
    rank: int
    score: float
    """Mean step time / median of the peers' mean step times over the window."""
    mean_step_s: float
    peers_median_step_s: float
    window_s: float
    node: str | None = None
    gpu_ids: tuple[str, ...] = ()


@dataclass
class _Rank:
    first_seen: float
    window: deque = field(default_factory=deque)  # (time, intervals, step_time_sum_s)
    node: str | None = None
    gpu_ids: tuple[str, ...] = ()
    flagged: bool = False


class StragglerDetector:
    def __init__(self, threshold: float | None, window_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self.attempt: int | None = None
        self._ranks: dict[int, _Rank] = {}

    def add(self, *, rank: int, attempt: int, time: float, intervals: int, step_time_sum_s: float,
            node: str | None = None, gpu_ids: tuple[str, ...] = (),
            first_time: float | None = None) -> list[StragglerVerdict]:
        """Account one summary; returns the ranks that just became stragglers."""
        if attempt != self.attempt:
            self.attempt, self._ranks = attempt, {}
        start = first_time if first_time is not None else time
        state = self._ranks.setdefault(rank, _Rank(first_seen=start))
        state.node, state.gpu_ids = node, tuple(gpu_ids)
        if intervals > 0:
            state.window.append((time, intervals, step_time_sum_s))
        self._prune(time)
        return self._judge(time)

    def _prune(self, now: float) -> None:
        for state in self._ranks.values():
            while state.window and state.window[0][0] < now - self.window_s:
                state.window.popleft()

    def means(self) -> dict[int, float]:
        out = {}
        for rank, state in self._ranks.items():
            n = sum(w[1] for w in state.window)
            if n:
                out[rank] = sum(w[2] for w in state.window) / n
        return out

    def scores(self) -> dict[int, float]:
        """Every rank's current straggler score (ranks with no peers: none)."""
        means = self.means()
        out = {}
        for rank, mean in means.items():
            peers = [m for r, m in means.items() if r != rank]
            if peers:
                median = statistics.median(peers)
                out[rank] = mean / median if median > 0 else 1.0
        return out

    def states(self) -> dict[int, tuple[float | None, bool, str | None]]:
        """Every rank's ``(score, flagged, node)`` now (the straggler eviction's input)."""
        scores = self.scores()
        return {rank: (scores.get(rank), state.flagged, state.node)
                for rank, state in self._ranks.items()}

    def _judge(self, now: float) -> list[StragglerVerdict]:
        if self.threshold is None:
            return []
        means = self.means()
        verdicts = []
        for rank, score in self.scores().items():
            state = self._ranks[rank]
            observed = now - state.first_seen >= self.window_s
            if state.flagged or not observed or score < self.threshold:
                continue
            state.flagged = True
            peers = statistics.median([m for r, m in means.items() if r != rank])
            verdicts.append(StragglerVerdict(rank, score, means[rank], peers, self.window_s,
                                             state.node, state.gpu_ids))
        return verdicts


def describe(v: StragglerVerdict) -> str:
    gpus = f" GPU {','.join(v.gpu_ids)}" if v.gpu_ids else ""
    return (f"rank {v.rank} on node {(v.node or '?')[:12]}{gpus} is a straggler: mean step "
            f"{v.mean_step_s * 1e3:.1f} ms vs peers' median {v.peers_median_step_s * 1e3:.1f} ms "
            f"({v.score:.2f}x) over {v.window_s:g} s")


def verdict_fields(v: StragglerVerdict) -> dict[str, Any]:
    return {"ratio": round(v.score, 4), "mean_step_s": v.mean_step_s,
            "peers_median_step_s": v.peers_median_step_s, "window_s": v.window_s,
            "gpu_ids": list(v.gpu_ids)}
