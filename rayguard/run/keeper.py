"""MemoryKeeper: the actor that owns a node's in-memory checkpoint copies.

One per node, started by the run's coordinator (which thereby owns it), so that the copies
it ``ray.put``s outlive every worker-group restart (Ray 2.56 removed ``ray.put(_owner=)``,
hence one keeper per node). Run-side, not worker code: the workers' half of the memory tier
is :mod:`rayguard.train.memory_tier`.
"""

from __future__ import annotations

from typing import Any


class MemoryKeeper:
    """Actor body: one per node, created by the coordinator. It owns the memory copies."""

    def hold(self, files: dict[str, Any]) -> list[Any]:
        """Copy ``files`` into this node's object store; the reference comes back in a list
        (so that it is passed on, not resolved)."""
        import ray

        return [ray.put(files)]

    def ping(self) -> bool:
        return True


def start_keeper(node_id: str) -> Any:
    """A keeper on ``node_id`` (called in the coordinator, which thereby owns it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(MemoryKeeper).options(
        num_cpus=0, max_concurrency=4,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
