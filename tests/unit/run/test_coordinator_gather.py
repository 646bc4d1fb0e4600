"""The coordinator's gathers and facts (rayguard.run.waits), on the actor's class itself (no
Ray): ranks as coroutines on one event loop, as the actor's calls are, up to 20,000 of them
waiting at once; and from threads through the in-process coordinator."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayguard.run.coordinator import RunCoordinator
from rayguard.run.waits import FactBoard, GatherBoard
from rayguard.testing.coordinator import InProcessCoordinator


def coordinator(tmp_path) -> RunCoordinator:
    return RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})


async def gather_all(c: RunCoordinator, tag: str, world_size: int, values: dict[int, object],
                     timeout_s: float = 60.0) -> dict[int, object]:
    ranks = list(values)
    out = await asyncio.gather(*(c.gather(tag, r, world_size, values[r], timeout_s)
                                 for r in ranks))
    return dict(zip(ranks, out, strict=True))


def test_every_rank_gets_the_values_in_rank_order(tmp_path):
    c = coordinator(tmp_path)
    out = asyncio.run(gather_all(c, "setup", 3, {2: "c", 0: "a", 1: "b"}))
    assert out == {0: ["a", "b", "c"], 1: ["a", "b", "c"], 2: ["a", "b", "c"]}


@pytest.mark.parametrize("ranks", [1100, 20000])
def test_any_number_of_ranks_wait_at_once(tmp_path, ranks):
    """No thread per waiting rank: 20,000 in-process callers complete one gather, arriving
    in a shuffled order, each counted once."""
    c = coordinator(tmp_path)
    order = list(range(ranks))
    order = order[1::2] + order[::2]
    out = asyncio.run(gather_all(c, "a0:setup", ranks, {r: r * 10 for r in order}))
    expected = [r * 10 for r in range(ranks)]
    assert len(out) == ranks and all(v == expected for v in out.values())
    assert c._gathers.calls == ranks and c._gathers.pending() == {}


def test_a_node_brings_its_ranks_at_once_and_each_is_counted_once(tmp_path):
    c = coordinator(tmp_path)

    async def run() -> list[object]:
        nodes = [{r: f"v{r}" for r in range(n * 4, n * 4 + 4)} for n in range(3)]
        return await asyncio.gather(*(c.gather_many("a0:commit", 12, node) for node in nodes))

    results = asyncio.run(run())
    assert results == [[f"v{r}" for r in range(12)]] * 3


def test_a_completed_gather_is_forgotten_so_the_tag_again_is_new(tmp_path):
    c = coordinator(tmp_path)

    async def run() -> None:
        await gather_all(c, "commit:5", 2, {0: 0, 1: 1})
        assert c._gathers.pending() == {}
        # the same tag again is a new gather: the old values are not handed out a second time
        assert await c.gather("commit:5", 0, 2, "new", timeout_s=0.01) is None
        out = await gather_all(c, "commit:6", 2, {0: "x", 1: "y"})
        assert out[0] == ["x", "y"]

    asyncio.run(run())


def test_a_kept_gather_answers_a_later_replacement_with_its_new_value(tmp_path):
    c = coordinator(tmp_path)

    async def run() -> None:
        first = await asyncio.gather(*(c.gather("a0:setup", r, 3, f"r{r}", 5.0, True)
                                       for r in range(3)))
        assert first[0] == ["r0", "r1", "r2"]
        # rank 1 replaced in the same attempt: its peers' set-up facts come back at once
        assert await c.gather("a0:setup", 1, 3, "r1-new", 0.01, True) == ["r0", "r1-new", "r2"]

    asyncio.run(run())


def test_a_missing_rank_times_out_with_none(tmp_path):
    c = coordinator(tmp_path)
    assert asyncio.run(c.gather("t", 0, 2, "a", timeout_s=0.01)) is None


def test_a_release_ends_only_its_attempts_gathers_now_and_later(tmp_path):
    async def run() -> None:
        board = GatherBoard()
        lost, other = board.join("a0:x", 2, {0: 1}), board.join("a1:x", 2, {0: 1})
        board.release("a0:")
        assert await lost is None and not other.done()
        assert await board.join("a0:y", 2, {1: 1}) is None  # a late arrival: at once
        board.join("a1:x", 2, {1: 2})
        assert await other == [1, 2]

    asyncio.run(run())


def test_close_wakes_a_waiting_rank_with_none_from_another_thread(tmp_path):
    c = InProcessCoordinator(coordinator(tmp_path))
    out: list[object] = []
    waiter = threading.Thread(target=lambda: out.append(c.gather("t", 0, 2, "a", 600.0)))
    waiter.start()
    while not c._gathers.calls:  # the rank is in its wait
        threading.Event().wait(0.01)
    c.close()
    waiter.join(timeout=120)
    c.stop()
    assert not waiter.is_alive() and out == [None]


def test_a_fact_wait_is_answered_when_the_fact_is_left(tmp_path):
    async def run() -> None:
        facts = FactBoard()
        waits = [facts.wait("k") for _ in range(20000)]
        assert not any(w.done() for w in waits)
        facts.put("k", {"v": 1})
        assert {id(v) for v in await asyncio.gather(*waits)} == {id(facts.get("k"))}
        assert await facts.wait("k") == {"v": 1}  # there already: at once

    asyncio.run(run())


def test_a_long_poll_returns_none_after_its_hold_and_leaves_nothing_behind(tmp_path):
    c = coordinator(tmp_path)

    async def run() -> None:
        for _ in range(50):
            assert await c.wait_fact("never", 0.001) is None
        assert len(c._facts._waiters.get("never", [])) <= 1

    asyncio.run(run())


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3),
                          st.builds(ValueError, st.text(max_size=3))), max_size=40))
def test_an_errors_only_answer_by_value_is_what_errors_only_gives(values):
    """A node that is not a gather's root gets its errors by value (ErrorsOnly), made once
    for every node that asks, not a reference to a list of N Nones each."""
    from rayguard.run.waits import Answers, ErrorsOnly, errors_only

    answers = Answers()
    sent = answers.answer(values, full=False, by_ref=True)
    assert isinstance(sent, ErrorsOnly) and answers.answer(values, full=False, by_ref=True) is sent
    got = sent.values()
    assert [type(v) for v in got] == [type(v) for v in errors_only(values)]
    assert [str(v) for v in got] == [str(v) for v in errors_only(values)]
    assert len(sent.errors) == sum(isinstance(v, BaseException) for v in values)
