"""Per-rank state after a resize: replicated loads anywhere, rank-local follows the remap."""

from __future__ import annotations

import pytest

from rayguard.elastic import ReshardError, WorkerSlot, plan_ranks, plan_state_sources


def test_replicated_prefers_own_copy_else_lowest() -> None:
    assert plan_state_sources(4, [0, 1, 2, 3], [0, 2, None]) == {0: 0, 1: 2, 2: 0}
    assert plan_state_sources(4, [1, 3], [0, None, 3, 2]) == {0: 1, 1: 1, 2: 3, 3: 1}


def test_rank_local_follows_remap() -> None:
    first = plan_ranks([WorkerSlot(n) for n in "abcd"])
    after = plan_ranks([WorkerSlot(n) for n in "bd"], first.ranks)
    assert plan_state_sources(4, range(4), after, "rank_local") == {0: 1, 1: 3}


def test_rank_local_new_worker() -> None:
    with pytest.raises(ReshardError, match=r"new ranks \[1\]") as e:
        plan_state_sources(2, [0, 1], [0, None, 1], "rank_local")
    assert "missing='fresh'" in str(e.value)
    assert plan_state_sources(2, [0, 1], [0, None, 1], "rank_local", missing="fresh") == {0: 0, 2: 1}


def test_sharded_needs_same_world() -> None:
    assert plan_state_sources(2, [0, 1], [1, 0], "sharded") == {0: 0, 1: 1}
    with pytest.raises(ReshardError, match="sharded over 4 ranks"):
        plan_state_sources(4, range(4), [0, 1, 2], "sharded")
    with pytest.raises(ReshardError, match="shards present: 1"):
        plan_state_sources(2, [0], [0, 1], "sharded")


def test_bad_inputs() -> None:
    with pytest.raises(ReshardError, match="no per-rank state"):
        plan_state_sources(2, [], [0])
    with pytest.raises(ReshardError, match="outside"):
        plan_state_sources(2, [5], [0])
    with pytest.raises(ReshardError, match="unknown kind"):
        plan_state_sources(2, [0], [0], "weird")  # type: ignore[arg-type]


def test_errors_pickle() -> None:
    import pickle

    e = ReshardError("x")
    assert pickle.loads(pickle.dumps(e)).args == ("x",)
