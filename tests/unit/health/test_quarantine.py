"""The quarantine planner, the node-failure reasons and the config fields (pure)."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError

from rayguard.exceptions import ConfigError, NonFiniteMetricError, PreflightError
from rayguard.failures import classify
from rayguard.health.config import HealthConfig
from rayguard.health.eviction import RankScore, StragglerEviction
from rayguard.health.quarantine import NodeFailure, node_failure_reason, plan_quarantine


def f(node: str, attempt: int, reason: str = "killed", rank: int = 0) -> NodeFailure:
    return NodeFailure(node, attempt, reason, rank)


def test_counted_per_attempt_not_per_worker() -> None:
    one_attempt = [f("a", 0, rank=0), f("a", 0, rank=1), f("a", 0, "oom", rank=2)]
    assert plan_quarantine(one_attempt, 2).new == ()
    decision = plan_quarantine([*one_attempt, f("a", 1, "cuda"), f("b", 1)], 2)
    assert [q.node for q in decision.new] == ["a"] and decision.excluded == {"a"}
    q = decision.new[0]
    assert q.attempts == (0, 1) and q.reason == "cuda" and len(q.failures) == 2
    assert "quarantine lift RUN_DIR a" in q.describe() and "/r " in q.describe("/r")


def test_quarantined_nodes_are_not_decided_again_and_stay_excluded() -> None:
    decision = plan_quarantine([f("a", 0), f("a", 1), f("b", 0), f("b", 2)], 2, quarantined={"a"})
    assert [q.node for q in decision.new] == ["b"] and decision.excluded == {"a", "b"}
    assert plan_quarantine([f("a", 3)], 1, quarantined={"a"}).new == ()


def test_a_lift_forgives_the_failures_before_it() -> None:
    failures = [f("a", 0), f("a", 1)]
    assert plan_quarantine(failures, 2, lifted={"a": 1}).new == ()
    assert plan_quarantine([*failures, f("a", 2)], 2, lifted={"a": 1}).new == ()
    assert [q.attempts for q in plan_quarantine([*failures, f("a", 2), f("a", 4)], 2,
                                                lifted={"a": 1}).new] == [(2, 4)]


def test_straggler_is_immediate_and_none_turns_everything_off() -> None:
    assert [q.reason for q in plan_quarantine([f("s", 0, "straggler")], 5).new] == ["straggler"]
    assert plan_quarantine([f("a", 0), f("a", 1), f("s", 0, "straggler")], None).new == ()
    assert plan_quarantine([f("a", 0, "bogus"), f("a", 1, "bogus")], 2).new == ()


def test_the_clusters_only_node_is_withheld_not_quarantined() -> None:
    decision = plan_quarantine([f("a", 0), f("a", 1)], 2, nodes_alive=1)
    assert decision.new == () and [q.node for q in decision.withheld] == ["a"]
    assert decision.excluded == frozenset()
    assert [q.node for q in plan_quarantine([f("a", 0), f("a", 1)], 2, nodes_alive=2).new] == ["a"]


@pytest.mark.parametrize(("error", "mark", "reason"), [
    (ActorDiedError(), None, "killed"),                      # killed by the OS, a segfault
    (RuntimeError("CUDA error: an illegal memory access was encountered"), None, "cuda"),
    (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp: unhandled cuda error"), None, None),
    (RuntimeError("torch.OutOfMemoryError: CUDA out of memory"), None, "oom"),
    (PreflightError("rank 0: no GPU"), None, "preflight"),
    (RuntimeError("Connection reset by peer"), None, None),  # a peer's loss: not this node
    (ValueError("bad shape"), None, None),                   # the training function's bug
    (NonFiniteMetricError("loss is nan"), None, None),
    (RuntimeError("x"), "killed by rayguard: stall", None),  # each rank's own watchdog
    (ActorDiedError(), "injected kill", None),               # RAYGUARD_FAULTS, not the node
    (RuntimeError("NodeDiedError: the node was removed"), None, None),  # preemption
])
def test_which_failures_count_against_the_node(error, mark, reason) -> None:
    assert node_failure_reason(classify(error, mark)) == reason


def test_a_collateral_nccl_error_does_not_count_but_the_culprits_cuda_error_does() -> None:
    from torch.distributed import DistBackendError

    assert node_failure_reason(classify(DistBackendError("CUDA error: device-side assert"))) is None


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"quarantine_after": 0}, "HealthConfig(quarantine_after=0): must be an int >= 1"),
    ({"quarantine_after": True}, "quarantine_after=True"),
    ({"quarantine_after": 1.5}, "quarantine_after=1.5"),
    ({"straggler_evict_after_s": -1}, "straggler_evict_after_s=-1"),
    ({"straggler_evict_after_s": float("inf")}, "straggler_evict_after_s=inf"),
    ({"straggler_evict_after_s": 10, "straggler_threshold": None}, "straggler_threshold=None"),
    ({"straggler_evict_after_s": 10, "quarantine_after": None}, "quarantine_after=None"),
])
def test_config_errors_name_field_value_and_fix(kwargs, needle) -> None:
    with pytest.raises(ConfigError, match="Fix:") as info:
        HealthConfig(**kwargs)
    assert needle in str(info.value)


def test_config_defaults() -> None:
    h = HealthConfig()
    assert h.quarantine_after == 2 and h.straggler_evict_after_s is None
    assert HealthConfig(quarantine_after=None, straggler_evict_after_s=None).quarantine_after is None
    assert HealthConfig(straggler_evict_after_s=0).straggler_evict_after_s == 0


def test_a_straggler_is_evicted_after_staying_flagged_once() -> None:
    ev = StragglerEviction(evict_after_s=10, threshold=1.5)
    slow = {0: RankScore(1.0, False, "fast"), 1: RankScore(3.0, True, "slow")}
    assert ev.observe(0, 100.0, slow) == []
    assert ev.observe(0, 105.0, slow) == []
    out = ev.observe(0, 110.0, slow)
    assert [(x.node, x.reason, x.rank, x.attempt) for x in out] == [("slow", "straggler", 1, 0)]
    assert "straggler_evict_after_s=10" in out[0].detail
    assert ev.observe(0, 200.0, slow) == []  # once


def test_a_break_resets_the_clock_and_unflagged_ranks_never_count() -> None:
    ev = StragglerEviction(evict_after_s=10, threshold=1.5)
    over, under = RankScore(3.0, True, "n"), RankScore(1.2, True, "n")
    ev.observe(0, 0.0, {1: over})
    ev.observe(0, 8.0, {1: under})      # caught up: the clock starts again
    assert ev.observe(0, 12.0, {1: over}) == []
    assert ev.observe(0, 21.0, {1: over}) == []
    assert len(ev.observe(0, 22.0, {1: over})) == 1
    ev2 = StragglerEviction(evict_after_s=0, threshold=1.5)
    assert ev2.observe(0, 0.0, {1: RankScore(3.0, False, "n")}) == []   # not flagged yet
    assert ev2.observe(0, 0.0, {1: RankScore(None, True, "n")}) == []   # no peers
    ev3 = StragglerEviction(evict_after_s=5, threshold=1.5)
    ev3.observe(0, 0.0, {1: over})
    assert ev3.observe(1, 6.0, {1: over}) == []  # a new attempt starts afresh


def test_straggler_eviction_on_a_fixed_size_run_warns_that_it_is_ignored() -> None:
    import warnings

    from ray.train import ScalingConfig

    import rayguard

    guard = rayguard.GuardConfig(health=HealthConfig(straggler_evict_after_s=60))
    with pytest.warns(UserWarning, match="straggler_evict_after_s=60") as caught:
        rayguard.RobustTrainer(lambda: None, guard_config=guard,
                               scaling_config=ScalingConfig(num_workers=2))
    (message,) = [str(w.message) for w in caught if "evict" in str(w.message)]
    assert "needs an elastic run" in message and "Fix:" in message
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        rayguard.RobustTrainer(lambda: None, guard_config=guard,
                               scaling_config=ScalingConfig(num_workers=(1, 2)))
    assert not [w for w in quiet if "evict" in str(w.message)]
