"""The straggler rule's leave-one-out medians, read off one sort (O(N log N) for a whole run's
ranks, where a median per rank was O(N^2)), equal the plain definition."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from rayguard.observe.straggler import StragglerDetector, peer_medians


@given(st.dictionaries(st.integers(0, 10_000), st.floats(0.0, 10.0), max_size=40))
def test_each_ranks_peer_median_is_the_median_of_the_others(means):
    expected = {r: statistics.median([m for o, m in means.items() if o != r])
                for r in means if len(means) > 1}
    assert peer_medians(means) == expected


def test_a_batch_judged_once_flags_the_slow_rank_of_16384():
    detector = StragglerDetector(threshold=1.5, window_s=10.0)
    for t in (0.0, 11.0):
        for rank in range(16384):
            detector.add(rank=rank, attempt=0, time=t, intervals=10,
                         step_time_sum_s=2.0 if rank == 11 else 1.0, judge=False)
    verdicts = detector.judge(11.0)
    assert [v.rank for v in verdicts] == [11] and verdicts[0].score == 2.0


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0.0, 3.0), st.integers(0, 4),
                          st.floats(0.0, 1.0)), max_size=60),
       st.floats(0.5, 5.0))
def test_kept_window_totals_equal_the_window_summed_again(feed, window_s):
    """A rank's mean is read off totals kept as summaries come and go; it equals the sum of
    what is in its window now, whatever the order of arrivals and judgements."""
    detector = StragglerDetector(threshold=1.5, window_s=window_s)
    now = 0.0
    for rank, dt, intervals, step_time in feed:
        now += dt
        detector.add(rank=rank, attempt=0, time=now, intervals=intervals,
                     step_time_sum_s=step_time * intervals, judge=False)
        verdicts, scores = detector.judge_scores(now)
        assert scores == detector.scores()
        windows = {r: list(s.window) for r, s in detector._ranks.items()}
        expected = {r: sum(w[2] for w in win) / sum(w[1] for w in win)
                    for r, win in windows.items() if sum(w[1] for w in win)}
        means = detector.means()
        assert means.keys() == expected.keys()
        for r, mean in means.items():
            assert abs(mean - expected[r]) <= 1e-9 * max(1.0, expected[r])
