"""Leave quarantined nodes out of a worker group's placement (pure).

Ray places each worker of a group by its bundle's label selector (``ScalingConfig(
label_selector=...)``: one dict for every worker, or one per worker). :func:`exclude_nodes`
adds ``ray.io/node-id: "!in(a, b)"`` to each worker's selector and combines it with what the
user set for that label: a ``!in``/``!`` exclusion is widened, an ``in(...)`` list loses the
quarantined nodes, a pinned node stays pinned when it is admitted. A user selector that only
admits quarantined nodes cannot be honoured: :class:`~rayguard.exceptions.ConfigError` says
which and how to lift the quarantine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rayguard.exceptions import ConfigError

NODE_ID_LABEL = "ray.io/node-id"
"""Ray's default node label: every node carries its own id under it."""


def _values(text: str) -> list[str]:
    inner = text[text.index("(") + 1:text.rindex(")")]
    return [v.strip() for v in inner.split(",") if v.strip()]


def _join(op: str, values: Iterable[str]) -> str:
    return f"{op}({', '.join(sorted(set(values)))})"


def merge_one(selector: dict[str, str] | None, excluded: frozenset[str], worker: int,
              label: str = NODE_ID_LABEL) -> dict[str, str]:
    """One worker's selector with ``excluded`` nodes left out."""
    out = dict(selector or {})
    given = out.get(label)
    if not excluded:
        return out
    if not given:
        out[label] = _join("!in", excluded)
    elif given.startswith("!in("):
        out[label] = _join("!in", {*_values(given), *excluded})
    elif given.startswith("!"):
        out[label] = _join("!in", {given[1:], *excluded})
    elif given.startswith("in("):
        left = [v for v in _values(given) if v not in excluded]
        if not left:
            raise _unplaceable(given, worker, label)
        out[label] = _join("in", left) if len(left) > 1 else left[0]
    elif given in excluded:
        raise _unplaceable(given, worker, label)
    return out


def exclude_nodes(selectors: Sequence[dict[str, str]] | dict[str, str] | None,
                  excluded: Iterable[str], num_workers: int,
                  label: str = NODE_ID_LABEL) -> list[dict[str, str]] | None:
    """Per-worker selectors (``num_workers`` of them) that leave ``excluded`` out.

    ``selectors``: what Ray would place the group with (``None``, one dict for all, or one
    per worker). With no node excluded it is returned as a per-worker list unchanged
    (``None`` stays ``None``)."""
    nodes = frozenset(excluded)
    per_worker: list[Any]
    if isinstance(selectors, dict):
        per_worker = [selectors] * num_workers
    elif selectors is None:
        if not nodes:
            return None
        per_worker = [None] * num_workers
    else:
        given: list[Any] = list(selectors)[:num_workers]
        per_worker = given + [None] * (num_workers - len(given))
    return [merge_one(s, nodes, i, label) for i, s in enumerate(per_worker)]


def _unplaceable(given: str, worker: int, label: str) -> ConfigError:
    return ConfigError(
        f"ScalingConfig(label_selector=...) for worker {worker}: {label}={given!r} admits only "
        "quarantined nodes, so the worker cannot be placed. Fix: lift the quarantine "
        "(rayguard quarantine lift RUN_DIR NODE, or --all), widen the selector, or turn "
        "quarantine off with HealthConfig(quarantine_after=None)")


def workers_that_fit(nodes: dict[str, dict[str, float]], per_worker: dict[str, float],
                     excluded: Iterable[str] = ()) -> int:
    """How many workers of ``per_worker`` resources the ``nodes`` (node id -> total
    resources) hold, not counting the ``excluded`` ones (a worker needing nothing: any
    number, returned as a large int)."""
    needed = {k: v for k, v in per_worker.items() if v > 0}
    if not needed:
        return 1 << 30
    left_out = frozenset(excluded)
    return sum(int(min(res.get(k, 0.0) // v for k, v in needed.items()))
               for node, res in nodes.items() if node not in left_out)
