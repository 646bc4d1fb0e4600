"""The culprit planner over plain answers (no Ray, no torch): a rank behind, a rank with no
answer, mismatched collectives, nobody behind, nobody in a collective, several groups."""

from __future__ import annotations

from rayguard.health.culprit import Collective, GroupState, RankAnswer, find_culprits


def c(seq, op="all_reduce", sizes=((4,),), pg="0"):
    return Collective(pg, seq, op, sizes)


def waiting(rank, seq, **kw):
    return RankAnswer(rank, {"0": GroupState(c(seq, **kw), seq - 1)}, node=f"n{rank}")


def idle(rank, seq, **kw):
    return RankAnswer(rank, {"0": GroupState(c(seq, **kw), seq)}, node=f"n{rank}")


def test_the_rank_that_never_entered_is_the_culprit_and_the_line_names_it():
    answers = {0: waiting(0, 41), 1: RankAnswer(1, {"0": GroupState(c(40), 40)}, node="nX",
                                                gpu_ids=("3",), top_frame="train.py:9 in loop"),
               2: waiting(2, 41), 3: waiting(3, 41)}
    d = find_culprits(answers, 4)
    assert d.culprits == (1,) and d.waiting == (0, 2, 3) and d.silent == ()
    assert d.collective == c(41) and d.mismatch is None
    assert d.nodes == {1: "nX"} and d.gpu_ids == {1: ("3",)}
    assert d.detail == ("rank 1 on node nX, GPU 3 never entered all_reduce #41 that ranks 0, 2, 3 "
                        "wait in; its stack: train.py:9 in loop")


def test_one_waiting_rank_reads_in_the_singular():
    d = find_culprits({0: waiting(0, 7), 1: idle(1, 6)}, 2)
    assert d.culprits == (1,) and "that rank 0 waits in" in d.detail


def test_a_rank_with_no_answer_is_a_culprit_placed_from_set_up():
    d = find_culprits({0: waiting(0, 5), 1: None, 2: waiting(2, 5)}, 3,
                      place={1: {"node": "n1", "gpu_ids": ["0"]}})
    assert d.culprits == (1,) and d.silent == (1,) and d.waiting == (0, 2)
    assert d.nodes == {1: "n1"} and d.gpu_ids == {1: ("0",)}
    assert "rank 1 on node n1, GPU 0 gave no answer" in d.detail
    # a rank missing from the answers altogether is the same as one that sent None
    assert find_culprits({0: waiting(0, 5)}, 2).culprits == (1,)


def test_a_rank_behind_and_a_silent_one_are_both_named():
    d = find_culprits({0: waiting(0, 9), 1: idle(1, 8), 2: None}, 3)
    assert d.culprits == (1, 2) and d.waiting == (0,)
    assert "rank 1 on node n1 never entered" in d.detail and "rank 2 gave no answer" in d.detail


def test_a_different_op_at_the_same_seq_is_a_mismatch_naming_the_odd_rank():
    answers = {0: waiting(0, 5), 1: waiting(1, 5, op="broadcast"), 2: waiting(2, 5),
               3: waiting(3, 5)}
    d = find_culprits(answers, 4)
    assert d.culprits == (1,) and d.waiting == (0, 2, 3) and d.collective == c(5)
    assert d.mismatch == ("at #5: ranks 0, 2, 3 in all_reduce of [[4]]; "
                          "rank 1 in broadcast of [[4]]")
    assert d.detail.startswith("mismatched collectives: rank 1 on node n1 entered broadcast "
                               "of [[4]] as #5 while ranks 0, 2, 3 wait in all_reduce")


def test_the_same_op_with_other_sizes_is_a_mismatch_too():
    answers = {0: waiting(0, 5), 1: waiting(1, 5), 2: waiting(2, 5, sizes=((8,),))}
    d = find_culprits(answers, 3)
    assert d.culprits == (2,) and "[[8]]" in (d.mismatch or "")


def test_a_tie_names_every_rank_at_the_seq():
    d = find_culprits({0: waiting(0, 5), 1: waiting(1, 5, op="broadcast")}, 2)
    assert d.culprits == (0, 1) and d.waiting == () and d.mismatch


def test_everyone_in_the_same_collective_is_nobody_behind():
    d = find_culprits({0: waiting(0, 3), 1: waiting(1, 3)}, 2)
    assert d.culprits == () and d.waiting == (0, 1)
    assert "none is behind" in d.detail and "all_reduce #3" in d.detail


def test_no_rank_in_a_collective_is_a_stall_in_own_code():
    d = find_culprits({0: idle(0, 3), 1: idle(1, 3)}, 2)
    assert d.culprits == () and d.collective is None
    assert "own code" in d.detail
    nothing = find_culprits({0: RankAnswer(0), 1: RankAnswer(1)}, 2)
    assert nothing.culprits == () and nothing.collective is None


def test_the_group_waited_in_is_the_one_with_waiting_ranks_and_its_members_only():
    answers = {
        0: RankAnswer(0, {"0": GroupState(c(4), 4), "1": GroupState(c(2, pg="1"), 1, (0, 1))}),
        1: RankAnswer(1, {"0": GroupState(c(4), 4), "1": GroupState(c(1, pg="1"), 1, (0, 1))}),
        2: RankAnswer(2, {"0": GroupState(c(4), 4)}),  # not a member of group 1
    }
    d = find_culprits(answers, 3)
    assert d.collective == c(2, pg="1") and d.culprits == (1,) and d.waiting == (0,)
    assert "all_reduce #2 of group 1" in d.detail


def test_fields_are_json_ready():
    d = find_culprits({0: waiting(0, 2), 1: idle(1, 1)}, 2)
    assert d.fields() == {
        "culprits": [1], "waiting": [0],
        "collective": {"op": "all_reduce", "pg": "0", "seq": 2, "sizes": [[4]]},
        "mismatch": None, "silent": [], "nodes": {"1": "n1"}, "gpu_ids": {"1": []}}


def test_the_answer_bound_is_validated_with_a_fix():
    import pytest

    from rayguard import HealthConfig
    from rayguard.exceptions import ConfigError

    assert HealthConfig().diagnosis_wait_s == 5.0
    for bad in (0, -1, float("inf"), True, "5"):
        with pytest.raises(ConfigError, match="diagnosis_wait_s"):
            HealthConfig(diagnosis_wait_s=bad)
