"""Each worker's replica group at its world rank (rayguard._ray.resize.align_replica_groups),
on fake workers and groups shaped as Ray's: Ray builds one group per worker in creation
order before rayguard's rank order moves the workers, and whatever goes by group index (Ray's
replacement of a failed rank's group, a resize in place's shrink) must find that rank's
worker there."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import rayguard._ray.resize as ray_resize
from rayguard._ray.train import permute_workers


@dataclasses.dataclass
class Context:
    world_rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0


@dataclasses.dataclass
class GroupContext:
    num_workers: int


class Group:
    """A replica group of one or more workers; remembers whether it was shut down."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers, self.stopped = workers, False

    def get_workers(self) -> list[Any]:
        return self.workers

    def shutdown(self) -> None:
        self.stopped = True


def started_group(world: int, perm: list[int]) -> SimpleNamespace:
    """A worker group as Ray leaves it after a start whose rank order was ``perm``."""
    workers = [SimpleNamespace(name=f"w{i}", metadata=SimpleNamespace(node_ip=f"ip{i}"),
                               distributed_context=Context(i, world)) for i in range(world)]
    groups = [Group([w]) for w in workers]  # Ray: creation order, before the callbacks
    mapping = {i: i for i in range(world)}
    permute_workers(workers, perm)  # rayguard's rank order, in Ray's own list
    state = SimpleNamespace(workers=workers, placement_group_handle=None, sync_actor=None)
    group = SimpleNamespace(
        _worker_group_state=state,
        _replica_groups=groups, _worker_rank_to_replica_group_rank=mapping,
        _world_rank_to_ongoing_poll={}, _latest_poll_status=None,
        _worker_group_context=GroupContext(world))
    group.get_workers = lambda: group._worker_group_state.workers
    return group


def test_after_a_remap_each_rank_finds_its_own_group() -> None:
    group = started_group(3, [2, 0, 1])  # rank 0 is the worker Ray created third
    assert group._replica_groups[0].get_workers()[0] is not group.get_workers()[0]
    ray_resize.align_replica_groups(group)
    for rank, worker in enumerate(group.get_workers()):
        assert group._replica_groups[rank].get_workers() == [worker]
        assert worker.distributed_context.world_rank == rank
        assert group._worker_rank_to_replica_group_rank[rank] == rank


def test_groups_of_several_workers_keep_rays_order() -> None:
    group = started_group(4, [1, 0, 3, 2])
    pairs = [Group(group.get_workers()[0:2]), Group(group.get_workers()[2:4])]
    group._replica_groups = list(pairs)
    ray_resize.align_replica_groups(group)
    assert group._replica_groups == pairs


def test_a_shrink_after_a_remap_stops_the_lost_rank_not_the_one_at_its_index(
        monkeypatch) -> None:
    monkeypatch.setattr(ray_resize, "WorkerGroupState", SimpleNamespace)
    group = started_group(3, [2, 0, 1])
    lost = group.get_workers()[2]
    kept = group.get_workers()[:2]
    owner = {id(w): g for g in group._replica_groups for w in g.get_workers()}
    ray_resize.shrink_group(group, keep=[0, 1])
    assert owner[id(lost)].stopped  # the lost rank's own group
    assert not any(owner[id(w)].stopped for w in kept)
    assert group.get_workers() == kept
    assert [g.get_workers() for g in group._replica_groups] == [[w] for w in kept]
