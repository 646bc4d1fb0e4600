"""Old home of the driver's progress printer, kept until its last importers (``rayguard.train``
and :mod:`rayguard.trainer`) import the new homes; not public.

The printer is :mod:`rayguard.observe.progress`; the two names workers need live where
workers can import them without the driver's printer: ``NOTABLE_KINDS`` in
:mod:`rayguard.events.kinds`, ``SEND_INTERVAL_S`` in :mod:`rayguard.constants`.
"""

from __future__ import annotations

import importlib
from typing import Any

_MOVED = {
    "NOTABLE_KINDS": "rayguard.events.kinds",
    "SEND_INTERVAL_S": "rayguard.constants",
    "ProgressPrinter": "rayguard.observe.progress",
    "attempt_view": "rayguard.observe.progress",
    "event_line": "rayguard.observe.progress",
    "next_line": "rayguard.observe.progress",
    "progress_line": "rayguard.observe.progress",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # lazily, so that a worker asking for the two constants never loads the printer;
    # cached, as a worker asks on every progress report
    value = globals()[name] = getattr(importlib.import_module(_MOVED[name]), name)
    return value
