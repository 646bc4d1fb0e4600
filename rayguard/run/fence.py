"""NodeFence: the run's quarantine, kept in its coordinator (it outlives every worker group).

It collects node failures (:class:`~rayguard.health.quarantine.NodeFailure`) from the
controller (a worker's classified failure), from the straggler eviction and, for a
diagnosed hang, from whoever names the culprit (``RunCoordinator.record_node_failures``);
asks the pure planner (:func:`~rayguard.health.quarantine.plan_quarantine`) which nodes to
quarantine; returns the ``node_quarantined`` events to record; and persists the quarantine in
the run directory (:mod:`rayguard.health.quarantine_file`). At each worker-group start the
controller asks :meth:`NodeFence.excluded`, which re-reads that file: a node a person lifted
(``rayguard quarantine lift``) is admitted again from that attempt on (``quarantine_lifted``).
The file's entries never fence every alive node (:func:`~rayguard.health.quarantine.fence_nodes`):
anyone who can write the run directory can write that file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from rayguard.events import make_event
from rayguard.health import quarantine_file
from rayguard.health.eviction import RankScore, StragglerEviction
from rayguard.health.quarantine import NodeFailure, Quarantined, fence_nodes, plan_quarantine

logger = logging.getLogger("rayguard")


class NodeFence:
    def __init__(self, quarantine_after: int | None = 2, path: str | None = None,
                 straggler_evict_after_s: float | None = None,
                 straggler_threshold: float | None = None,
                 alive_nodes: Callable[[], Collection[str] | None] | None = None) -> None:
        """``alive_nodes``: the ids of the cluster's alive nodes (``None`` when not known;
        default: asked of Ray)."""
        self.quarantine_after = quarantine_after
        self.path = path
        """The run directory's quarantine file (``None``: a remote run directory; the
        quarantine then lasts for this ``fit()`` only)."""
        self._failures: list[NodeFailure] = []
        self._quarantined: dict[str, dict[str, Any]] = {}
        self._lifted: dict[str, int] = {}
        self._withheld: set[str] = set()
        self._own: set[str] = set()
        """The nodes this run's rule quarantined (the others came from the file)."""
        self._from_file_withheld: frozenset[str] = frozenset()
        self._alive_nodes = alive_nodes or _alive_node_ids
        self.eviction = (StragglerEviction(straggler_evict_after_s, straggler_threshold)
                         if straggler_evict_after_s is not None and straggler_threshold is not None
                         and quarantine_after is not None else None)
        self._quarantined.update(self._read().get("nodes", {}))

    # -- failures in -------------------------------------------------------------------------
    def record(self, failures: Iterable[NodeFailure], nodes_alive: int | None = None
               ) -> list[dict[str, Any]]:
        """Count ``failures``; the ``node_quarantined`` events of the nodes this quarantines."""
        self._failures.extend(failures)
        applied = set(self._quarantined) - self._from_file_withheld
        decision = plan_quarantine(self._failures, self.quarantine_after, applied,
                                   self._lifted, nodes_alive=nodes_alive)
        for q in decision.withheld:
            if q.node not in self._withheld:
                self._withheld.add(q.node)
                logger.info("rayguard: node %s met the quarantine rule (%s in attempts %s) but "
                            "is the cluster's only node: not quarantined", q.node[:12],
                            q.reason, list(q.attempts))
        if not decision.new:
            return []
        for q in decision.new:
            self._own.add(q.node)
            self._quarantined[q.node] = {"reason": q.reason,
                                         "failures": [f.to_dict() for f in q.failures]}
        self._persist(decision.new)
        return [self._event(q) for q in decision.new]

    def on_scores(self, attempt: int, now: float, ranks: Mapping[int, RankScore]
                  ) -> list[dict[str, Any]]:
        """The straggler scores after a step summary: evictions quarantine at once."""
        if self.eviction is None:
            return []
        evicted = [f for f in self.eviction.observe(attempt, now, ranks)
                   if f.node not in self._quarantined]
        return self.record(evicted) if evicted else []

    # -- placement out ---------------------------------------------------------------------
    def excluded(self, attempt: int) -> tuple[list[str], list[dict[str, Any]]]:
        """The nodes the next worker group (the one after ``attempt``, the latest started)
        must leave out, and the ``quarantine_lifted`` events of the nodes lifted in the file
        since the last call."""
        state = self._read()
        events = []
        if self.path is not None:
            on_file = state.get("nodes", {})
            for node in sorted(set(self._quarantined) - set(on_file)):
                del self._quarantined[node]
                self._own.discard(node)
                self._lifted[node] = attempt  # failures so far are forgiven
                events.append(make_event(
                    "quarantine_lifted", f"node {node[:12]} admitted again from attempt "
                    f"{attempt + 1} on (its quarantine was lifted)", node=node, attempt=attempt))
            for node, entry in on_file.items():
                self._quarantined.setdefault(node, entry)
        for e in events:  # the count once every lift of this call is applied
            e["quarantined_nodes"] = len(self._quarantined)
        decision = fence_nodes(self._own, set(self._quarantined) - self._own, self._alive_nodes())
        self._note_withheld(decision.withheld)
        return sorted(decision.fenced), events

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """``{node: {"reason", "failures"}}`` of the nodes left out now."""
        return {n: dict(e) for n, e in self._quarantined.items()
                if n not in self._from_file_withheld}

    def _note_withheld(self, withheld: frozenset[str]) -> None:
        if withheld and withheld != self._from_file_withheld:
            logger.warning("rayguard: the quarantine file %s names every alive node; its "
                           "entries for %s are not applied (a run never fences all its nodes). "
                           "Fix: lift them with `rayguard quarantine lift`, or add nodes",
                           self.path, ", ".join(n[:12] for n in sorted(withheld)))
        self._from_file_withheld = withheld

    # -- helpers ---------------------------------------------------------------------------
    def _event(self, q: Quarantined) -> dict[str, Any]:
        run_dir = os.path.dirname(self.path) if self.path else "RUN_DIR"
        return make_event("node_quarantined", q.describe(run_dir), node=q.node, reason=q.reason,
                          rank=q.failures[-1].rank, attempts=list(q.attempts),
                          failures=[f.to_dict() for f in q.failures],
                          quarantined_nodes=len(self._quarantined))

    def _read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            return quarantine_file.read(self.path)
        except (OSError, ValueError) as exc:
            logger.warning("rayguard: cannot read the quarantine file %s (%s); keeping the "
                           "quarantine this run knows", self.path, exc)
            return {"nodes": dict(self._quarantined)}

    def _persist(self, new: Iterable[Quarantined]) -> None:
        if self.path is None:
            return
        try:
            quarantine_file.add(self.path, new)
        except (OSError, ValueError) as exc:
            logger.warning("rayguard: could not write the quarantine file %s: %s", self.path, exc)


def _alive_node_ids() -> frozenset[str] | None:
    """The ids of the cluster's alive nodes (``None``: not known, outside Ray)."""
    from rayguard._ray.core import alive_node_resources

    try:
        return frozenset(alive_node_resources())
    except Exception:
        return None
