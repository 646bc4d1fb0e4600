"""A rank's consecutive step summaries merged into one (what a node's agent sends the
coordinator) equal the one summary its StepTimer sends over the same reports at a longer
interval: the goodput and the straggler rule read the same sums either way."""

from __future__ import annotations

from functools import reduce

from hypothesis import given
from hypothesis import strategies as st

from rayguard.observe.steps import MAX_SAMPLES, StepTimer, merge_summaries


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


REPORT = st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 0.5), st.integers(0, 3),
                   st.floats(-10.0, 10.0))


def _timer(interval_s: float, clock: Clock) -> StepTimer:
    return StepTimer(interval_s=interval_s, clock=clock, wall=clock, max_samples=4)


@given(st.lists(REPORT, min_size=2, max_size=80), st.integers(0, 4))
def test_merged_summaries_equal_one_summary_over_the_same_reports(reports, replay_until):
    clock = Clock()
    often, once = _timer(0.0, clock), _timer(1e9, clock)  # a summary every report; one
    for timer in (often, once):
        timer.begin()
        timer.replaying(replay_until)
    sent, first = [], None
    for step, (dt, blocked, stepped, loss) in enumerate(reports):
        clock.t += dt
        for _ in range(stepped):
            often.optimizer_stepped()
            once.optimizer_stepped()
        sent.append(often.on_report(step, {"loss": loss}, blocked))
        got = once.on_report(step, {"loss": loss}, blocked)
        if step == 0:
            first = got
        else:
            assert got is None
    # the first report's summary goes at once from both; the rest, once as one
    assert sent[0] == first
    merged = reduce(lambda a, b: merge_summaries(a, b, max_samples=4), sent[1:])
    whole = once.take()
    for key in whole:
        if key == "samples":
            assert len(merged["samples"]) < 2 * 4 and merged["samples"][0] == whole["samples"][0]
            assert all(s in [[r, v] for r, (_, _, _, v) in enumerate(reports)]
                       for s in merged["samples"])
        elif isinstance(whole[key], float):
            assert abs(merged[key] - whole[key]) <= 1e-9 * max(1.0, abs(whole[key])), key
        else:
            assert merged[key] == whole[key], key
    assert set(merged) == set(whole)


def test_the_later_summary_gives_what_is_not_a_count():
    a = {"rank": 3, "attempt": 1, "time": 10.0, "reports": 2, "intervals": 2,
         "step_time_sum_s": 1.0, "step_time_max_s": 0.6, "first_step": 1, "last_step": 2,
         "first_time": 9.0, "last_time": 10.0, "samples": [[1, 0.5]], "metric": "loss"}
    b = dict(a, time=15.0, step_time_max_s=0.4, first_step=3, last_step=7, first_time=11.0,
             last_time=15.0, samples=[[4, 0.25]] * (2 * MAX_SAMPLES))
    m = merge_summaries(a, b)
    assert (m["time"], m["reports"], m["step_time_sum_s"], m["step_time_max_s"]) == (15.0, 4, 2.0, 0.6)
    assert (m["first_step"], m["last_step"], m["first_time"], m["last_time"]) == (1, 7, 9.0, 15.0)
    assert m["samples"][0] == [1, 0.5] and len(m["samples"]) < 2 * MAX_SAMPLES
