"""Explicit results of queue operations (never "None or something falsy").

A pop that finds nothing returns the sentinel ``EMPTY`` (a member of the enum
``Empty``), so an empty ``bytes`` payload and "nothing there" can never be
confused.  A push that does not fit returns ``Push.FULL``; the caller decides
whether to spin, park or buffer.  Alternatives rejected: ``None`` (falsy, and
easy to confuse with a missing return), exceptions (too slow on the hot path of
a spinning consumer).
"""
from __future__ import annotations

import enum

__all__ = ["Empty", "EMPTY", "Push"]


class Empty(enum.Enum):
    """Result of a pop that found no record."""

    EMPTY = 0


EMPTY = Empty.EMPTY


class Push(enum.Enum):
    """Result of a non-blocking push."""

    OK = 0
    FULL = 1
