"""Deprecated: the event log reader is :mod:`rayguard.events.read` (with
:mod:`rayguard.events.lines`); this path keeps its old names importable."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "EventSource": "rayguard.events.lines", "LineReader": "rayguard.events.lines",
    "CHUNK_BYTES": "rayguard.events.lines", "ParsedLog": "rayguard.events.read",
    "locate": "rayguard.events.read", "normalize": "rayguard.events.read",
    "parse_line": "rayguard.events.read", "parse_lines": "rayguard.events.read",
    "iter_events": "rayguard.events.read", "read_log": "rayguard.events.read",
    "follow": "rayguard.events.read", "SWEEP_EVENTS_FILENAME": "rayguard.constants",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(f"rayguard.observe.log.{name} moved to {_MOVED[name]}.{name}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_MOVED[name]), name)
