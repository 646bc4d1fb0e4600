"""A fake Ray actor handle over an in-process object whose methods run on an event loop:
the node agents' and coordinator's tests drive real objects through it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections import Counter
from typing import Any


class ActorDied(Exception):
    """What a call to a dead actor raises."""


class Handle:
    """A fake actor handle over ``obj`` whose methods run on ``loop``; counts the calls.
    ``dead``: every call raises; ``late``: the named methods run but never answer."""

    def __init__(self, obj: Any, loop: asyncio.AbstractEventLoop, *, dead: bool = False,
                 late: tuple[str, ...] = ()) -> None:
        self.obj, self.loop, self.dead, self.late = obj, loop, dead, late
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        handle = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> concurrent.futures.Future:
                handle.calls[name] += 1
                if handle.dead:
                    fut: concurrent.futures.Future = concurrent.futures.Future()
                    fut.set_exception(ActorDied(f"{name}: the actor died"))
                    return fut
                ran = asyncio.run_coroutine_threadsafe(call(getattr(handle.obj, name), args),
                                                       handle.loop)
                return concurrent.futures.Future() if name in handle.late else ran

        return Method


async def call(fn: Any, args: tuple) -> Any:
    """``fn(*args)``, awaited when it gives an awaitable (an actor method, sync or async)."""
    out = fn(*args)
    return await out if inspect.isawaitable(out) else out
