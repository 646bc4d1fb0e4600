"""Reading a record's number fields: what a log holds may be anything JSON holds (a record
written by another version, a hand-edited line), and a bool is not a number there (Python
counts ``True`` as the int 1). The one owner of that rule for the readers of the event log,
its step summaries, the goodput accounting and the report."""

from __future__ import annotations

from typing import Any


def is_number(value: Any) -> bool:
    """``value`` is an int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool), else ``None``."""
    return float(value) if is_number(value) else None


def integer(value: Any) -> int | None:
    """``value`` when it is an int (not a bool), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def event_time(event: dict[str, Any]) -> float | None:
    """A record's ``time`` (``None``: missing or not a number)."""
    return number(event.get("time"))
