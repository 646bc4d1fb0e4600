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


def test_a_rank_behind_is_named_and_a_silent_one_beside_it_is_taken_as_waiting():
    # Was: both named. The silent rank is not the evidence: the one behind explains the hang
    # (measured at 8 ranks: rank 6 behind, ranks 3, 5, 7 silent in the all-reduce).
    d = find_culprits({0: waiting(0, 9), 1: idle(1, 8), 2: None}, 3)
    assert d.culprits == (1,) and d.waiting == (0,) and d.silent == (2,) and d.rule == "behind"
    assert "rank 1 on node n1 never entered" in d.detail
    assert "rank 2 gave no answer (taken as waiting in all_reduce #9" in d.detail


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


# -- the decision table, one test per row (rayguard/health/culprit.py's docstring) --------
def between(rank, seq):
    """A rank that answered from between two collectives (completed ``seq``, not inside)."""
    return RankAnswer(rank, {"0": GroupState(c(seq), seq)}, node=f"n{rank}",
                      top_frame="train.py:40 in loop")


def test_row_all_answered_is_the_rule_of_before():
    assert find_culprits({0: waiting(0, 5), 1: idle(1, 4)}, 2).rule == "all_answered"
    assert find_culprits({0: waiting(0, 5), 1: waiting(1, 5)}, 2).culprits == ()


def test_row_behind_measured_at_8_ranks_names_the_rank_behind_only():
    answers = {r: waiting(r, 101) for r in (0, 1, 2, 4)}
    answers.update({6: between(6, 100), 3: None, 5: None, 7: None})
    d = find_culprits(answers, 8)
    assert d.rule == "behind" and d.culprits == (6,) and d.silent == (3, 5, 7)
    assert d.waiting == (0, 1, 2, 4) and set(d.nodes) == {6}
    assert "ranks 3, 5, 7 gave no answer (taken as waiting in all_reduce #101" in d.detail


def test_row_behind_with_a_mismatch_names_the_odd_rank_not_the_silent():
    answers = {0: waiting(0, 5), 1: waiting(1, 5), 2: waiting(2, 5, op="broadcast"), 3: None}
    d = find_culprits(answers, 4)
    assert d.rule == "behind" and d.culprits == (2,) and d.mismatch


def test_row_silent_everyone_who_answered_waits_so_the_silent_are_named():
    d = find_culprits({0: waiting(0, 5), 1: waiting(1, 5), 2: waiting(2, 5), 3: None}, 4)
    assert d.rule == "silent" and d.culprits == (3,) and d.waiting == (0, 1, 2)
    # even when most are silent: the rank holding the group up can only be among them
    many = find_culprits({0: waiting(0, 5), 1: None, 2: None, 3: None}, 4)
    assert many.rule == "silent" and many.culprits == (1, 2, 3)


def test_row_outside_measured_at_16_ranks_names_the_one_that_answered():
    answers = {r: None for r in range(16)}
    answers[13] = between(13, 200)
    d = find_culprits(answers, 16)
    assert d.rule == "outside" and d.culprits == (13,) and d.collective is None
    assert d.silent == tuple(r for r in range(16) if r != 13) and d.nodes == {13: "n13"}
    assert d.detail == ("rank 13 on node n13 is stalled outside any collective; its stack: "
                        "train.py:40 in loop; ranks 0-12, 14, 15 gave no answer (taken as "
                        "waiting in the next collective: a rank blocked in a collective may "
                        "not answer)")
    small = find_culprits({0: None, 1: None, 2: between(2, 3), 3: None}, 4)
    assert small.rule == "outside" and small.culprits == (2,)


def test_row_silent_outside_a_silent_minority_or_no_collectives_is_named_as_before():
    d = find_culprits({0: between(0, 3), 1: None}, 2)  # a tie: half silent
    assert d.rule == "silent_outside" and d.culprits == (1,)
    d = find_culprits({0: between(0, 3), 1: between(1, 3), 2: None}, 3)
    assert d.rule == "silent_outside" and d.culprits == (2,)
    # most silent, but the one that answered has no collective recorded: no evidence
    d = find_culprits({0: RankAnswer(0), 1: None, 2: None}, 3)
    assert d.rule == "silent_outside" and d.culprits == (1, 2)
    # nobody answered at all
    assert find_culprits({}, 3).culprits == (0, 1, 2)


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
