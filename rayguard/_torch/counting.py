"""rayguard's own counting hook on the ``torch.distributed`` collectives, for a torch whose
Flight Recorder records nothing (an older torch, gloo before torch 2.13, the buffer off).

:func:`install` wraps the collective functions of the ``torch.distributed`` module in this
process: per process group a sequence number, the op, the input sizes, entered and
completed, the same shape :func:`rayguard._torch.flight_recorder.collective_state` answers
(:func:`collective_state`). The gap: only calls through the module's functions are seen
(``dist.all_reduce(...)``); DDP's gradient all-reduce (its C++ reducer calls the process
group directly) and a name imported before set-up (``from torch.distributed import
all_reduce``) are not. A call with ``async_op=True`` counts as completed when it returns its
work (the wait is not seen).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object",
       "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
       "all_to_all_single", "barrier", "broadcast_object_list")
"""The functions counted (each one collective of its group)."""

_MARK = "__rayguard_counted__"


class Counter:
    """Per process group name: the last collective entered and the last completed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self._entered: dict[str, dict[str, Any]] = {}
        self._completed: dict[str, int] = {}
        self._depth = threading.local()

    def enter(self, pg: str, op: str, sizes: list[list[int]]) -> int | None:
        """A collective starts (``None``: nested in a counted one, not counted again)."""
        if getattr(self._depth, "n", 0):
            self._depth.n += 1
            return None
        self._depth.n = 1
        with self._lock:
            seq = self._seq.get(pg, 0) + 1
            self._seq[pg] = seq
            self._entered[pg] = {"seq": seq, "op": op, "sizes": sizes}
            self._completed.setdefault(pg, 0)
        return seq

    def leave(self, pg: str, seq: int | None, *, completed: bool) -> None:
        self._depth.n = max(getattr(self._depth, "n", 1) - 1, 0)
        if seq is not None and completed:
            with self._lock:
                self._completed[pg] = max(self._completed.get(pg, 0), seq)

    def state(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {pg: {"entered": dict(e), "completed": self._completed.get(pg, 0),
                         "ranks": []} for pg, e in self._entered.items()}


COUNTER = Counter()  # per process: it counts the calls of torch's own (per-process) functions


def _group_name(group: Any) -> str:
    name = getattr(group, "group_name", None) if group is not None else None
    return str(name) if name else "0"


def _sizes(args: tuple[Any, ...]) -> list[list[int]]:
    first = args[0] if args else None
    tensors: list[Any] = list(first) if isinstance(first, (list, tuple)) else [first]
    return [list(t.shape) for t in tensors if hasattr(t, "shape")]


def _wrap(name: str, fn: Callable[..., Any], counter: Counter) -> Callable[..., Any]:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        pg = _group_name(kwargs.get("group"))
        seq = counter.enter(pg, name, _sizes(args))
        done = False
        try:
            result = fn(*args, **kwargs)
            done = True
            return result
        finally:
            counter.leave(pg, seq, completed=done)

    setattr(counted, _MARK, fn)
    return counted


def install(counter: Counter = COUNTER, module: Any = None) -> bool:
    """Wrap the collectives of ``module`` (``torch.distributed``) once; ``False`` when there
    is no ``torch.distributed`` or they were wrapped already."""
    if module is None:
        try:
            import torch.distributed as module
        except ImportError:
            return False
    changed = False
    for name in OPS:
        fn = getattr(module, name, None)
        if fn is None or hasattr(fn, _MARK):
            continue
        setattr(module, name, _wrap(name, fn, counter))
        changed = True
    return changed


def uninstall(module: Any = None) -> None:
    """Put the original functions back (tests)."""
    if module is None:
        import torch.distributed as module
    for name in OPS:
        fn = getattr(module, name, None)
        if fn is not None and hasattr(fn, _MARK):
            setattr(module, name, getattr(fn, _MARK))


def collective_state(counter: Counter = COUNTER) -> dict[str, dict[str, Any]]:
    """What the hook counted, per process group (see the module docstring)."""
    return counter.state()
