"""Text from files that may come from elsewhere, made inert before a CLI prints it: control
characters (terminal escapes, carriage returns, backspaces), C1 controls, bidirectional and
invisible formatting characters and lone surrogates are shown escaped (``\\x1b``,
``\\u202e``), so a crafted event detail or manifest path cannot clear the screen, move the
cursor or paint a fake "OK" line."""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
    "\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: Any) -> str:
    """``str(text)`` with every character that could steer a terminal escaped. One line:
    newlines are escaped too (apply it per line to keep a multi-line text's lines)."""
    return _UNSAFE.sub(_escape, str(text))


def inert_lines(text: str) -> str:
    """:func:`inert` on each line of ``text``, keeping its line breaks."""
    return "\n".join(inert(line) for line in text.split("\n"))
