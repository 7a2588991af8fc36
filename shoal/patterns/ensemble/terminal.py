"""Text from a journal or a task, made safe to print on a terminal.

A leaf of the ensemble package (the stdlib only), so the status, report and command
modules all use it without importing each other.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` for a terminal: control characters (escape sequences that set the window
    title, clear the screen or write the clipboard) shown as ``\\x1b``, not obeyed.  Failure
    tails are a task's stderr, and a journal is whatever its author wrote (a trust boundary)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


__all__ = ["printable"]
