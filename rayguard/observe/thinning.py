"""Curves of bounded length from logs of any length (pure).

:func:`thin` keeps every k-th point of a list; :class:`Thinned` does the same while the
points stream in, one series per key (an attempt), never holding more than a budget: every
``stride``-th point offered is kept, and when the series together hold more than
``budget_points`` (and each series' ``floor_points``), the stride doubles and every series
drops every other point it kept (but for a series at its floor, kept whole). A week-long
run is then read in the memory of an hour-long one, and draws as fast.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_POINTS = 4000
"""Points per curve in the report (longer series are thinned evenly, keeping the ends): a
week-long run draws as fast as a short one."""


def thin(points: list[Any], max_points: int = MAX_POINTS) -> list[Any]:
    """Every k-th point so that at most ``max_points`` remain (the last one is kept)."""
    if len(points) <= max_points:
        return points
    stride = -(-len(points) // max_points)
    out = points[::stride]
    if out[-1] is not points[-1]:
        out.append(points[-1])
    return out


@dataclass
class _Series:
    items: list[Any] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)  # the points each kept item holds
    points: int = 0  # their sum
    stride: int = 1
    offered: int = 0  # items offered (kept or not)
    offered_points: int = 0  # ... and the points they held

    def halve(self) -> None:
        self.items, self.weights = self.items[::2], self.weights[::2]
        self.points, self.stride = sum(self.weights), self.stride * 2

    def coarsen(self, stride: int) -> None:
        """Keep every item a series of ``stride`` would have (strides are powers of 2)."""
        step = stride // self.stride
        if step > 1:
            self.items, self.weights = self.items[::step], self.weights[::step]
            self.points, self.stride = sum(self.weights), stride


class Thinned:
    """Items per key, each series thinned evenly in the order the items came; an item may
    hold several points (``weight``: a step summary's metric samples). All series share
    one density (:attr:`stride`) except a short one, which keeps at least ``floor_points``
    at a finer stride (as the report draws at least 200 points of each attempt)."""

    def __init__(self, budget_points: int, floor_points: int) -> None:
        if budget_points < 1 or floor_points < 1:
            raise ValueError(f"Thinned(budget_points={budget_points}, floor_points="
                             f"{floor_points}): both must be >= 1")
        self.budget_points, self.floor_points = budget_points, floor_points
        self._series: dict[Hashable, _Series] = {}
        self.points = 0
        """Points held, all series together."""
        self.stride = 1
        """One item kept of every ``stride`` offered (a short series: fewer)."""

    def add(self, key: Hashable, item: Any, weight: int = 1) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        series.offered += 1
        series.offered_points += weight
        if (series.offered - 1) % series.stride:
            return
        series.items.append(item)
        series.weights.append(weight)
        series.points += weight
        self.points += weight
        if series.stride < self.stride and series.points > 2 * self.floor_points:
            self._coarsen(series, self.stride)
        if self.points > self.limit():
            self.stride *= 2
            for each in self._series.values():
                self._coarsen(each, self.stride)

    def _coarsen(self, series: _Series, stride: int) -> None:
        """Halve ``series`` towards ``stride`` while it keeps ``floor_points``."""
        while series.stride < stride and series.points > 2 * self.floor_points:
            held = series.points
            series.halve()
            self.points -= held - series.points

    def limit(self) -> int:
        """The most points held: the budget, and each series' floor (twice: a short series
        halves past it)."""
        return self.budget_points + 2 * self.floor_points * len(self._series)

    def drop(self, key: Hashable) -> None:
        """Forget the series of ``key`` (its lead rank changed)."""
        series = self._series.pop(key, None)
        if series is not None:
            self.points -= series.points

    def merge(self, key: Hashable, later: Thinned) -> None:
        """Append ``later``'s series of ``key`` (the items that came after) to this one's,
        both thinned to the coarser stride."""
        theirs = later._series.get(key)
        if theirs is None:
            return
        mine = self._series.get(key)
        if mine is None:
            mine = self._series[key] = _Series(stride=theirs.stride)
        stride = max(mine.stride, theirs.stride)
        self.stride = max(self.stride, later.stride)
        self.points -= mine.points
        mine.coarsen(stride)
        theirs.coarsen(stride)
        mine.items += theirs.items
        mine.weights += theirs.weights
        mine.points, mine.offered = sum(mine.weights), mine.offered + theirs.offered
        mine.offered_points += theirs.offered_points
        self.points += mine.points
        self._coarsen(mine, self.stride)

    def keys(self) -> list[Hashable]:
        return list(self._series)

    def offered(self, key: Hashable) -> int:
        """The points offered for ``key``, kept or not."""
        series = self._series.get(key)
        return 0 if series is None else series.offered_points

    def items(self, key: Hashable) -> list[Any]:
        """The items kept for ``key``, in the order they came."""
        series = self._series.get(key)
        return [] if series is None else series.items

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._series)
