"""RunCoordinator.gather, on the actor's class itself (no Ray): ranks in threads, as the
actor's concurrent calls are (``max_concurrency``)."""

from __future__ import annotations

import threading

from rayguard.run.coordinator import RunCoordinator


def coordinator(tmp_path) -> RunCoordinator:
    return RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})


def gather_all(c: RunCoordinator, tag: str, world_size: int, values: dict[int, object],
               timeout_s: float = 60.0) -> dict[int, object]:
    out: dict[int, object] = {}

    def call(rank: int) -> None:
        out[rank] = c.gather(tag, rank, world_size, values[rank], timeout_s)

    threads = [threading.Thread(target=call, args=(r,)) for r in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return out


def test_every_rank_gets_the_values_in_rank_order(tmp_path):
    c = coordinator(tmp_path)
    out = gather_all(c, "setup", 3, {2: "c", 0: "a", 1: "b"})
    assert out == {0: ["a", "b", "c"], 1: ["a", "b", "c"], 2: ["a", "b", "c"]}


def test_a_gather_is_freed_once_every_rank_has_read_it(tmp_path):
    c = coordinator(tmp_path)
    gather_all(c, "commit:5", 2, {0: 0, 1: 1})
    assert c._gathers == {} and c._gather_reads == {}
    # The same tag again is a new gather: the old values are not handed out a second time.
    assert c.gather("commit:5", 0, 2, "new", timeout_s=0.01) is None
    out = gather_all(c, "commit:6", 2, {0: "x", 1: "y"})
    assert out[0] == ["x", "y"]


def test_a_gather_is_kept_until_the_last_rank_has_read_it(tmp_path):
    c = coordinator(tmp_path)
    c._gathers["t"] = {0: "a", 1: "b"}  # both ranks arrived; neither has read yet
    assert c.gather("t", 0, 2, "a", timeout_s=0.01) == ["a", "b"]
    assert c._gathers["t"] == {0: "a", 1: "b"} and c._gather_reads == {"t": 1}
    assert c.gather("t", 1, 2, "b", timeout_s=0.01) == ["a", "b"]
    assert "t" not in c._gathers and "t" not in c._gather_reads


def test_a_missing_rank_times_out_with_none(tmp_path):
    c = coordinator(tmp_path)
    assert c.gather("t", 0, 2, "a", timeout_s=0.01) is None


def test_close_wakes_a_waiting_rank_with_none(tmp_path):
    c = coordinator(tmp_path)
    out: list[object] = []
    waiter = threading.Thread(target=lambda: out.append(c.gather("t", 0, 2, "a", 600.0)))
    waiter.start()
    while "t" not in c._gathers:  # the rank is in (or about to enter) its wait
        threading.Event().wait(0.01)
    c.close()
    waiter.join(timeout=120)
    assert not waiter.is_alive() and out == [None]
