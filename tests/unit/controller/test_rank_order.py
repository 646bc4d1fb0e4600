"""The rank-order hook on fake worker records (the same attributes Ray Train's Worker has):
NUMA order is covered end to end in tests/ray/test_numa_trainer.py; here, the elastic
remapping across restarts, with no cluster. The previous assignment lives in an in-memory
store with the coordinator's get/put (the one source of truth)."""

from dataclasses import dataclass, field

from rayguard.controller.rank_order import RankOrder
from rayguard.elastic.remap import ASSIGNMENT_KEY, previous_rank_of


class DictStore(dict):
    def put(self, key, value):
        self[key] = value


@dataclass
class Meta:
    node_id: str
    gpu_ids: list = field(default_factory=list)
    node_ip: str = "10.0.0.1"


@dataclass
class Ctx:  # Ray's DistributedContext
    world_rank: int
    world_size: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0


@dataclass
class FakeWorker:
    metadata: Meta
    distributed_context: Ctx
    resources: dict = field(default_factory=lambda: {"CPU": 1.0})


def _group(nodes):
    return [FakeWorker(Meta(n), Ctx(r, len(nodes))) for r, n in enumerate(nodes)]


def _ranks(workers):
    return {w.metadata.node_id: w.distributed_context.world_rank for w in workers}


def test_first_attempt_keeps_rays_order_for_cpu_workers():
    hook = RankOrder(numa=True, store=DictStore())
    workers = _group(["a", "b", "c"])
    hook.before_init_train_context(workers)
    assert _ranks(workers) == {"a": 0, "b": 1, "c": 2}


def test_survivors_keep_rank_and_newcomers_fill_lowest_free_ranks():
    hook = RankOrder(numa=False, store=DictStore())
    hook.before_init_train_context(_group(["a", "b", "c", "d"]))
    # Node b is lost, node e joins; Ray happens to list e before c and d.
    workers = _group(["a", "e", "c", "d"])
    hook.before_init_train_context(workers)
    assert _ranks(workers) == {"a": 0, "e": 1, "c": 2, "d": 3}
    assert [w.distributed_context.world_rank for w in workers] == [0, 1, 2, 3]
    # Shrink: c lost; d shifts down only as far as the smaller world forces.
    workers = _group(["d", "a", "e"])
    hook.before_init_train_context(workers)
    assert _ranks(workers) == {"a": 0, "e": 1, "d": 2}
    assert [w.metadata.node_id for w in workers] == ["a", "e", "d"]


def test_the_store_record_is_what_workers_read():
    store = DictStore()
    hook = RankOrder(numa=False, store=store)
    hook.before_init_train_context(_group(["a", "b", "c"]))
    assert store[ASSIGNMENT_KEY]["previous"] is None
    assert previous_rank_of(store[ASSIGNMENT_KEY], 0) == (None, None)  # a first attempt
    hook.before_init_train_context(_group(["c", "a"]))  # b lost, Ray lists c first
    record = store[ASSIGNMENT_KEY]
    # rank 0 is a (held rank 0 before), rank 1 is c (held rank 2); the old world had 3 ranks
    assert [previous_rank_of(record, r) for r in (0, 1)] == [(0, 3), (2, 3)]
    # a second hook reading the same store (a new controller object) continues from it
    workers = _group(["a", "c", "d"])
    RankOrder(numa=False, store=store).before_init_train_context(workers)
    assert _ranks(workers) == {"a": 0, "c": 1, "d": 2}
    assert previous_rank_of(store[ASSIGNMENT_KEY], 2) == (None, 2)


def test_without_a_store_every_start_is_a_first_start():
    hook = RankOrder(numa=False)
    hook.before_init_train_context(_group(["a", "b"]))
    workers = _group(["b", "a"])
    hook.before_init_train_context(workers)
    assert [w.metadata.node_id for w in workers] == ["b", "a"]


def test_a_failing_store_keeps_rays_order():
    class Broken:
        def get(self, key):
            raise ConnectionError("coordinator gone")

        def put(self, key, value):
            raise ConnectionError("coordinator gone")

    workers = _group(["b", "a"])
    RankOrder(numa=False, store=Broken()).before_init_train_context(workers)
    assert [w.metadata.node_id for w in workers] == ["b", "a"]


def _local(workers):
    return [(w.distributed_context.local_rank, w.distributed_context.local_world_size,
             w.distributed_context.node_rank) for w in workers]


def test_live_recovery_gets_local_ranks_of_the_whole_group_and_keeps_them_on_a_replacement():
    # Ray computes local ranks per replica group: under live recovery every worker is its
    # own, so all four were local rank 0 of 1 (every worker on one GPU of its node)
    store = DictStore()
    hook = RankOrder(numa=False, store=store, group_local_ranks=True)
    workers = [FakeWorker(Meta(f"n{r}", node_ip=ip), Ctx(r, 4))
               for r, ip in enumerate(["ip-a", "ip-a", "ip-b", "ip-b"])]
    hook.before_init_train_context(workers)
    assert _local(workers) == [(0, 2, 0), (1, 2, 0), (0, 2, 1), (1, 2, 1)]
    record = dict(store[ASSIGNMENT_KEY])
    # rank 3 replaced alone: Ray gives it its world rank and a one-worker local world
    replacement = [FakeWorker(Meta("n3", node_ip="ip-b"), Ctx(3, 4))]
    hook.before_init_train_context(replacement)
    assert _local(replacement) == [(1, 2, 1)]
    assert replacement[0].distributed_context.world_rank == 3
    assert store[ASSIGNMENT_KEY] == record  # the group's assignment is not a replacement's


def test_without_live_recovery_rays_local_ranks_stay():
    hook = RankOrder(numa=False, store=DictStore())
    workers = [FakeWorker(Meta(f"n{r}"), Ctx(r, 2, local_rank=r, local_world_size=2))
               for r in range(2)]
    hook.before_init_train_context(workers)
    assert _local(workers) == [(0, 2, 0), (1, 2, 0)]
