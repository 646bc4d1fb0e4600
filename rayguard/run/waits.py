"""The coordinator's waits, event-driven: gathers and facts completed by the last arrival.

Every wait the run's coordinator serves is an ``asyncio`` future on the actor's event loop,
not a thread: a waiting rank (or node agent) costs a future and a list entry, so there is
no cap on how many wait at once, and an arrival does O(1) work (the last one of a gather
O(N): it builds the answer once and completes every waiter). Nothing here blocks or
sleeps; the coordinator (:mod:`rayguard.run.coordinator`) and the node agents
(:mod:`rayguard.run.agent`) await what these return, with their own timeouts.

Call every method from the event loop's thread (the actor's methods run there).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

MAX_WAITERS = 1 << 20
"""The ``max_concurrency`` of the coordinator and node-agent actors: how many calls may wait
on their event loop at once (each a coroutine, not a thread: far beyond any world size)."""


def attempt_prefix(tag: str) -> str:
    """The attempt part of a gather tag (``"a3:"`` of ``"a3:setup"``): what a release names."""
    return tag[:tag.find(":") + 1]


@dataclass
class _Slot:
    world_size: int
    keep: bool
    values: dict[int, Any] = field(default_factory=dict)
    waiters: list[asyncio.Future[Any]] = field(default_factory=list)
    result: list[Any] | None = None
    batches: set[str] = field(default_factory=set)
    """The ids of the node batches joined (a relayed batch may arrive twice)."""


def _settle(waiters: list[asyncio.Future[Any]], value: Any) -> None:
    for fut in waiters:
        if not fut.done():  # a waiter that timed out has cancelled its own
            fut.set_result(value)
    waiters.clear()


class GatherBoard:
    """Gathers keyed by tag. :meth:`join` adds one or more ranks' values (a node agent
    brings its node's ranks at once, a relay its group's nodes', :meth:`join_batches`) and
    returns a future of every rank's values in rank order, completed when ``world_size``
    ranks have joined; ``None`` when the tag's attempt was released (:meth:`release`, a live
    recovery ended it) or the board closed.

    A gather is forgotten once complete, so a tag used again is a new gather; one joined
    with ``keep=True`` (set-up facts a replacement started later must still find) stays,
    answers every later arrival at once, and takes a later arrival's value in place of the
    rank's old one.

    A node batch that names its id (``batch``) is joined once whatever number of times it
    arrives: a relay's group batch and, after the relay was lost, the node's own copy sent
    straight here may both come, in either order (:mod:`rayguard.run.gather_relay`). A
    second copy of a batch that completed a gather is answered with that gather's values
    (the last :attr:`DONE_KEEP` gathers whose batches had ids are remembered), not taken
    for the start of a new one."""

    DONE_KEEP = 16
    """Completed gathers remembered for a late copy of one of their batches."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self._released: set[str] = set()
        self._closed = False
        self._done: OrderedDict[str, tuple[list[Any], set[str]]] = OrderedDict()
        self.calls = 0
        """Ranks' contributions received, each counted once (a metrics-only report makes
        none; a batch that arrives twice counts once)."""

    def join(self, tag: str, world_size: int, values: Mapping[int, Any], *,
             keep: bool = False, batch: str | None = None) -> asyncio.Future[list[Any] | None]:
        """Join ``values`` (``{rank: value}``); ``batch``: their node batch's id (``None``:
        a batch that arrives once, joined as it comes)."""
        return self._join(tag, world_size, [(batch, values)], keep)

    def join_batches(self, tag: str, world_size: int, batches: Mapping[str, Mapping[int, Any]],
                     *, keep: bool = False) -> asyncio.Future[list[Any] | None]:
        """Join several node batches at once (``{batch id: {rank: value}}``), each once."""
        return self._join(tag, world_size, list(batches.items()), keep)

    def _join(self, tag: str, world_size: int,
              batches: Sequence[tuple[str | None, Mapping[int, Any]]],
              keep: bool) -> asyncio.Future[list[Any] | None]:
        fut: asyncio.Future[list[Any] | None] = asyncio.get_running_loop().create_future()
        if self._closed or attempt_prefix(tag) in self._released:
            self.calls += sum(len(v) for _, v in batches)
            fut.set_result(None)
            return fut
        done = self._done.get(tag)
        if done is not None and tag not in self._slots:
            fresh = [(b, v) for b, v in batches if b is None or b not in done[1]]
            if not fresh:  # every batch here completed it: a second copy
                fut.set_result(done[0])
                return fut
            batches = fresh
        slot = self._slots.get(tag)
        if slot is None:
            slot = self._slots[tag] = _Slot(int(world_size), keep)
        for batch, values in batches:
            if batch is not None:
                if batch in slot.batches:
                    continue
                slot.batches.add(batch)
            slot.values.update(values)
            self.calls += len(values)
        if slot.result is not None:  # a kept gather, complete: answer with the new values
            slot.result = [slot.values[r] for r in sorted(slot.values)]
            fut.set_result(slot.result)
            return fut
        slot.waiters.append(fut)
        if len(slot.values) >= slot.world_size:
            self._complete(tag, slot)
        return fut

    def _complete(self, tag: str, slot: _Slot) -> None:
        result = [slot.values[r] for r in sorted(slot.values)]
        _settle(slot.waiters, result)
        if slot.keep:
            slot.result = result
            return
        del self._slots[tag]
        if slot.batches:
            self._done[tag] = (result, slot.batches)
            while len(self._done) > self.DONE_KEEP:
                self._done.popitem(last=False)

    def release(self, prefix: str) -> None:
        """Every gather of the attempt ``prefix`` (``"a3:"``) ends with ``None``, now and
        for every later arrival."""
        self._released.add(prefix)
        for tag in [t for t in self._slots if attempt_prefix(t) == prefix]:
            _settle(self._slots.pop(tag).waiters, None)

    def close(self) -> None:
        """The run ends: every waiter gets ``None``."""
        self._closed = True
        for slot in self._slots.values():
            _settle(slot.waiters, None)
        self._slots.clear()
        self._done.clear()

    def pending(self) -> dict[str, int]:
        """``{tag: ranks joined}`` of the gathers not complete (tests, diagnostics)."""
        return {t: len(s.values) for t, s in self._slots.items() if s.result is None}


class FactBoard:
    """Facts of the run by key, with waiters: :meth:`wait` is a future completed when the
    fact is there (at once when it is). ``None`` is never a fact's value."""

    def __init__(self) -> None:
        self._facts: dict[str, Any] = {}
        self._waiters: dict[str, set[asyncio.Future[Any]]] = {}

    def put(self, key: str, value: Any) -> None:
        if value is None:
            self._facts.pop(key, None)
            return
        self._facts[key] = value
        waiters = self._waiters.pop(key, None)
        if waiters:
            _settle(list(waiters), value)

    def get(self, key: str, default: Any = None) -> Any:
        return self._facts.get(key, default)

    def wait(self, key: str) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if key in self._facts:
            fut.set_result(self._facts[key])
        else:
            waiters = self._waiters.setdefault(key, set())
            waiters.add(fut)
            fut.add_done_callback(waiters.discard)  # a long poll that timed out leaves
        return fut

    def close(self) -> None:
        for waiters in self._waiters.values():
            _settle(list(waiters), None)
        self._waiters.clear()

    def items(self) -> list[tuple[str, Any]]:
        return list(self._facts.items())


def errors_only(values: list[Any]) -> list[Any]:
    """A gather's answer as a rank other than its root receives it: the errors (exceptions
    a rank sent as its value) in place, ``None`` elsewhere: what a commit's other ranks
    need, a fraction of the bytes of every rank's record."""
    return [v if isinstance(v, BaseException) else None for v in values]


class ErrorsOnly(NamedTuple):
    """:func:`errors_only` as it travels to a node: the answer's length and its errors by
    index (a commit's 2,047 other nodes of 2,048 get a few bytes by value, not a reference
    each to a list of N ``None``)."""

    size: int
    errors: dict[int, BaseException]

    @classmethod
    def of(cls, values: list[Any]) -> ErrorsOnly:
        return cls(len(values), {i: v for i, v in enumerate(values)
                                 if isinstance(v, BaseException)})

    def values(self) -> list[Any]:
        """The answer as :func:`errors_only` gives it."""
        out: list[Any] = [None] * self.size
        for i, error in self.errors.items():
            out[i] = error
        return out


class GroupAnswer(NamedTuple):
    """A completed gather's answer as a relay receives it for its group's nodes
    (:mod:`rayguard.run.gather_relay`): ``full`` for the nodes one of whose ranks needs every
    value, ``errors`` for the others, each in :class:`Answers`' form (``None``: no node of
    the group asked for it)."""

    full: Any
    errors: Any

    def for_node(self, full: bool) -> Any:
        """What a node gets: the whole answer when one of its ranks needs it (``full``)."""
        return self.full if full else self.errors


class Answers:
    """A completed gather's answers as they go out: whole, or :func:`errors_only`, and as
    an object reference (``by_ref``: put into the object store once for every node that
    asks, so that it is serialized once, not once per node; an errors-only answer goes by
    value instead, as :class:`ErrorsOnly`); each made once."""

    KEEP = 16
    """Answers kept: the gathers of now (older ones were fetched already)."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, bool], tuple[list[Any], list[Any], Any]] = {}

    def answer(self, result: list[Any], *, full: bool, by_ref: bool) -> Any:
        if full and not by_ref:
            return result
        key = (id(result), full)
        held = self._held.get(key)
        if held is None or held[0] is not result:
            answer = result if full else errors_only(result)
            ref: Any = None
            if by_ref and full:
                import ray

                ref = [ray.put(answer)]
            elif by_ref:
                ref = ErrorsOnly.of(result)
            held = self._held[key] = (result, answer, ref)
            while len(self._held) > self.KEEP:
                self._held.pop(next(iter(self._held)))
        return held[2] if by_ref else held[1]


async def bounded(fut: asyncio.Future[Any], timeout_s: float | None, *,
                  shared: bool = False) -> Any:
    """``fut``'s result, or ``None`` after ``timeout_s``. A waiter's own future is cancelled
    then (the board drops it); a ``shared`` one stays for the others who wait on it."""
    try:
        return await asyncio.wait_for(asyncio.shield(fut) if shared else fut, timeout_s)
    except asyncio.TimeoutError:
        return None


__all__ = ["MAX_WAITERS", "Answers", "ErrorsOnly", "FactBoard", "GatherBoard", "GroupAnswer",
           "attempt_prefix", "bounded", "errors_only"]
