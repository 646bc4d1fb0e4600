"""The rank-order hook on fake worker records (the same attributes Ray Train's Worker has):
NUMA order is covered end to end in tests/ray/test_numa_trainer.py; here, the elastic
remapping across restarts, with no cluster."""

from dataclasses import dataclass, field

from rayguard.placement.rank_order import RankOrder


@dataclass
class Meta:
    node_id: str
    gpu_ids: list = field(default_factory=list)


@dataclass
class Ctx:
    world_rank: int


@dataclass
class FakeWorker:
    metadata: Meta
    distributed_context: Ctx
    resources: dict = field(default_factory=lambda: {"CPU": 1.0})


def _group(nodes):
    return [FakeWorker(Meta(n), Ctx(r)) for r, n in enumerate(nodes)]


def _ranks(workers):
    return {w.metadata.node_id: w.distributed_context.world_rank for w in workers}


def test_first_attempt_keeps_rays_order_for_cpu_workers():
    hook = RankOrder(numa=True)
    workers = _group(["a", "b", "c"])
    hook.before_init_train_context(workers)
    assert _ranks(workers) == {"a": 0, "b": 1, "c": 2}


def test_survivors_keep_rank_and_newcomers_fill_lowest_free_ranks():
    hook = RankOrder(numa=False)
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
