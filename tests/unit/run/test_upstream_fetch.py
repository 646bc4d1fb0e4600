"""A gather's answer that never comes from the object store is asked for again by value
(rayguard/run/upstream.py): seen on a real 4-node cluster with node agents, where a node's
second batch of one gather waited for ever on the answer its first batch had fetched."""

from __future__ import annotations

import asyncio

import pytest

from rayguard.run import upstream
from rayguard.run.upstream import RayUpstream
from rayguard.run.waits import ErrorsOnly


class Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class Coordinator:
    """``gather_many`` answers ``[reference]`` by reference (one that never comes, or one
    that does) and the values by value; records each call's ``by_ref``."""

    def __init__(self, ref_comes: bool) -> None:
        self.calls: list[bool] = []
        self.ref_comes = ref_comes
        self.gather_many = Remote(self._gather_many)

    async def _gather_many(self, tag, world_size, values, timeout_s, keep, by_ref, root, batch):
        self.calls.append(by_ref)
        answer = [values[r] for r in sorted(values)] + ["peer"]
        if not by_ref:
            return answer
        ref = asyncio.get_running_loop().create_future()
        if self.ref_comes:
            ref.set_result(answer)
        return [ref]  # an awaitable, as Ray's ObjectRef is


def run(coordinator, batch, fetch_s=0.05):
    async def go():
        return await RayUpstream(coordinator).gather_many("a0:t", 2, {0: "mine"}, 30.0, False,
                                                          None, batch)

    saved, upstream.FETCH_S = upstream.FETCH_S, fetch_s
    try:
        return asyncio.run(asyncio.wait_for(go(), 5))
    finally:
        upstream.FETCH_S = saved


def test_an_answer_that_never_comes_is_asked_again_by_value():
    c = Coordinator(ref_comes=False)
    assert run(c, batch="node#1") == ["mine", "peer"]
    assert c.calls == [True, False]


def test_an_answer_that_comes_is_read_once():
    c = Coordinator(ref_comes=True)
    assert run(c, batch="node#1") == ["mine", "peer"]
    assert c.calls == [True]


def test_without_a_batch_id_it_is_not_asked_again():
    # asking again without the batch's id would join a new gather: wait as before
    c = Coordinator(ref_comes=False)
    with pytest.raises(asyncio.TimeoutError):
        run(c, batch=None)
    assert c.calls == [True]


def test_errors_only_answers_stay_by_value():
    async def go():
        return await RayUpstream(None).resolve(ErrorsOnly(3, {1: ValueError("x")}))

    values = asyncio.run(go())
    assert values[0] is None and isinstance(values[1], ValueError) and values[2] is None


def test_a_relayed_answer_that_never_comes_is_asked_again_by_value_at_once():
    # the relay passed the node its answer's reference; the node asks the coordinator again
    # with its batch's id, by value (not by reference first, which could wait as long again)
    from rayguard.run.gather_relay import RelayedGathers
    from rayguard.run.waits import GroupAnswer

    c = Coordinator(ref_comes=False)

    async def relay(tag, node, batch, world_size, values, timeout_s, keep, full):
        never = asyncio.get_running_loop().create_future()
        return GroupAnswer([never], None).for_node(full)

    async def go():
        gathers = RelayedGathers(RayUpstream(c), relay, node="n1")
        return await gathers.gather_many("a0:t", 2, {0: "mine"}, 30.0, False, None)

    saved, upstream.FETCH_S = upstream.FETCH_S, 0.05
    try:
        assert asyncio.run(asyncio.wait_for(go(), 5)) == ["mine", "peer"]
    finally:
        upstream.FETCH_S = saved
    assert c.calls == [False]
