"""Room on CPython's frame stack for the hot loops: ``in_room(fn, *args)``.

The search loops run from the base of a frame-stack chunk of their own, so a
recursion never calls across a chunk boundary (CPython 3.11/3.12's
mmap/munmap per call, gh-142183).  The implementation, its evidence and the
alternatives rejected are in the leaf module ``shoal/_room.py``, which the
worker's task loop (``shoal/runtime/worker.py``) uses too; this module is the
search package's name for it.
"""

from __future__ import annotations

from shoal._room import ROOM_WORDS, in_room

__all__ = ["ROOM_WORDS", "in_room"]
