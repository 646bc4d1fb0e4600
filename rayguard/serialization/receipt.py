"""What a process does the first time it decodes a rayguard tensor: a hook the decoder
calls, set by :mod:`rayguard.serialization.register` when it is imported (importing
``rayguard.serialization``, which the payload's ``codec.decode`` path does, imports it).

Kept apart so that the codec (pure) never imports the registration (the Ray adapter).
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[], None] | None = None  # per process: set once, when register is imported


def set_receipt_hook(hook: Callable[[], None] | None) -> None:
    """Install what :func:`on_receipt` runs (``None``: nothing)."""
    global _hook
    _hook = hook


def on_receipt() -> None:
    """Run the installed hook (the decoder calls this once per process)."""
    if _hook is not None:
        _hook()
