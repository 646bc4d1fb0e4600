"""Deprecated: the event log reader is :mod:`rayguard.events.read` (with
:mod:`rayguard.events.lines`); this path keeps its old names importable."""

from __future__ import annotations

from rayguard import _deprecated

_MOVED = {
    "EventSource": "rayguard.events.lines", "LineReader": "rayguard.events.lines",
    "CHUNK_BYTES": "rayguard.events.lines", "ParsedLog": "rayguard.events.read",
    "locate": "rayguard.events.read", "normalize": "rayguard.events.read",
    "parse_line": "rayguard.events.read", "parse_lines": "rayguard.events.read",
    "iter_events": "rayguard.events.read", "read_log": "rayguard.events.read",
    "follow": "rayguard.events.read", "SWEEP_EVENTS_FILENAME": "rayguard.constants",
}


__getattr__ = _deprecated.moved("rayguard.observe.log", _MOVED, why="module")
