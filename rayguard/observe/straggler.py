"""Straggler rule (pure; runs in the run's coordinator on the summaries of every rank).

Over a sliding window of ``window_s`` seconds, a rank's mean step time is compared with the
median of its peers' means. Its *straggler score* is that ratio. A rank is a straggler when
its score is at least ``threshold`` and it has been observed for a whole window (one slow
step or a slow start never flags it). The verdict is emitted once when a rank becomes a
straggler; the score is exposed continuously (a metric). A new attempt starts afresh.
"""

from __future__ import annotations

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
    intervals: int = 0
    """The window's intervals, kept as entries come and go (a mean is O(1), not O(window))."""
    step_time_s: float = 0.0
    """The window's step time, kept likewise (re-summed whenever the window empties)."""

    def push(self, time: float, intervals: int, step_time_sum_s: float) -> None:
        self.window.append((time, intervals, step_time_sum_s))
        self.intervals += intervals
        self.step_time_s += step_time_sum_s

    def prune(self, before: float) -> None:
        window = self.window
        while window and window[0][0] < before:
            _, intervals, step_time = window.popleft()
            self.intervals -= intervals
            self.step_time_s -= step_time
        if not window:
            self.intervals, self.step_time_s = 0, 0.0


class StragglerDetector:
    def __init__(self, threshold: float | None, window_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self.attempt: int | None = None
        self._ranks: dict[int, _Rank] = {}

    def add(self, *, rank: int, attempt: int, time: float, intervals: int, step_time_sum_s: float,
            node: str | None = None, gpu_ids: tuple[str, ...] = (),
            first_time: float | None = None, judge: bool = True) -> list[StragglerVerdict]:
        """Account one summary; returns the ranks that just became stragglers (``judge``
        False: none, call :meth:`judge` once after a batch: O(N log N) per batch, not per
        summary)."""
        if attempt != self.attempt:
            self.attempt, self._ranks = attempt, {}
        start = first_time if first_time is not None else time
        state = self._ranks.setdefault(rank, _Rank(first_seen=start))
        state.node, state.gpu_ids = node, tuple(gpu_ids)
        if intervals > 0:
            state.push(time, intervals, step_time_sum_s)
        return self.judge(time) if judge else []

    def judge(self, now: float) -> list[StragglerVerdict]:
        """Drop what left the window and return the ranks that just became stragglers."""
        return self.judge_scores(now)[0]

    def judge_scores(self, now: float) -> tuple[list[StragglerVerdict], dict[int, float]]:
        """:meth:`judge` and :meth:`scores` of one pass: the means and medians computed once
        (the coordinator's judgement every second at scale)."""
        self._prune(now)
        means = self.means()
        medians = peer_medians(means)
        return self._judge(now, means, medians), _scores(means, medians)

    def _prune(self, now: float) -> None:
        before = now - self.window_s
        for state in self._ranks.values():
            state.prune(before)

    def means(self) -> dict[int, float]:
        return {rank: state.step_time_s / state.intervals
                for rank, state in self._ranks.items() if state.intervals}

    def scores(self) -> dict[int, float]:
        """Every rank's current straggler score (ranks with no peers: none)."""
        means = self.means()
        return _scores(means, peer_medians(means))

    def ranks(self) -> int:
        """How many ranks this attempt's window holds."""
        return len(self._ranks)

    def states(self, scores: dict[int, float] | None = None
               ) -> dict[int, tuple[float | None, bool, str | None]]:
        """Every rank's ``(score, flagged, node)`` now (the straggler eviction's input;
        ``scores``: already computed)."""
        scores = self.scores() if scores is None else scores
        return {rank: (scores.get(rank), state.flagged, state.node)
                for rank, state in self._ranks.items()}

    def _judge(self, now: float, means: dict[int, float], medians: dict[int, float]
               ) -> list[StragglerVerdict]:
        if self.threshold is None:
            return []
        verdicts = []
        for rank, peers in medians.items():
            score = means[rank] / peers if peers > 0 else 1.0
            state = self._ranks[rank]
            observed = now - state.first_seen >= self.window_s
            if state.flagged or not observed or score < self.threshold:
                continue
            state.flagged = True
            verdicts.append(StragglerVerdict(rank, score, means[rank], peers, self.window_s,
                                             state.node, state.gpu_ids))
        return verdicts


def _scores(means: dict[int, float], medians: dict[int, float]) -> dict[int, float]:
    return {rank: (means[rank] / median if median > 0 else 1.0)
            for rank, median in medians.items()}


def peer_medians(means: dict[int, float]) -> dict[int, float]:
    """Each rank's median of the *other* ranks' means, for all ranks in O(N log N): one sort,
    then each leave-one-out median read off it (ranks with no peers: none)."""
    order = sorted(means, key=means.__getitem__)
    values = [means[r] for r in order]
    n = len(values)
    if n < 2:
        return {}

    def at(k: int, i: int) -> float:  # the k-th smallest once index i is left out
        return values[k] if k < i else values[k + 1]

    out = {}
    for i, rank in enumerate(order):
        m = n - 1
        out[rank] = (at(m // 2, i) if m % 2 else (at(m // 2 - 1, i) + at(m // 2, i)) / 2)
    return out


def describe(v: StragglerVerdict) -> str:
    gpus = f" GPU {','.join(v.gpu_ids)}" if v.gpu_ids else ""
    return (f"rank {v.rank} on node {(v.node or '?')[:12]}{gpus} is a straggler: mean step "
            f"{v.mean_step_s * 1e3:.1f} ms vs peers' median {v.peers_median_step_s * 1e3:.1f} ms "
            f"({v.score:.2f}x) over {v.window_s:g} s")


def verdict_fields(v: StragglerVerdict) -> dict[str, Any]:
    return {"ratio": round(v.score, 4), "mean_step_s": v.mean_step_s,
            "peers_median_step_s": v.peers_median_step_s, "window_s": v.window_s,
            "gpu_ids": list(v.gpu_ids)}
