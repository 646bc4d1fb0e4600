"""Deprecated: the driver's progress printer moved to :mod:`rayguard.observe.progress`.

The two names workers need live where workers import them without the driver's printer:
``NOTABLE_KINDS`` in :mod:`rayguard.events.kinds`, ``SEND_INTERVAL_S`` in
:mod:`rayguard.constants`. Each old name still imports from here, with a DeprecationWarning.
"""

from __future__ import annotations

from rayguard import _deprecated

__all__: list[str] = []

__getattr__ = _deprecated.moved("rayguard.progress", {
    "NOTABLE_KINDS": "rayguard.events.kinds",
    "SEND_INTERVAL_S": "rayguard.constants",
    "ProgressPrinter": "rayguard.observe.progress",
    "attempt_view": "rayguard.observe.progress",
    "event_line": "rayguard.observe.progress",
    "next_line": "rayguard.observe.progress",
    "progress_line": "rayguard.observe.progress",
}, why="module")
