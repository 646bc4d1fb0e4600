"""Fact keys are built and read back in one module."""

from rayguard.run.facts import CAUSE, KILLED, RankFact, cause_key, killed_key, rank_fact


def test_a_ranks_fact_reads_back_as_what_built_it():
    assert rank_fact(cause_key(3, 11)) == RankFact(CAUSE, 3, 11)
    assert rank_fact(killed_key(0, 2)) == RankFact(KILLED, 0, 2)


def test_other_keys_are_not_a_ranks_fact():
    for key in ("loaded:3", "cause:3", "cause:x:1", "live:pg:1", "killed:1:2:3", ""):
        assert rank_fact(key) is None
