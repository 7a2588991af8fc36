"""Ids the driver cancelled (or renamed) lately: a MOVED that names one gets a CANCEL.

A ``cancel()`` tells the task's holder to drop it; the holder may have handed the task
to a thief just before, its MOVED still on the way.  When that MOVED arrives, the task
is no longer in the driver's table, and without a memory of the id the thief would run
a cancelled task.  The same holds for the old id of a task taken back from a stopped
or dead worker (stopped.py): a MOVED of the old id is answered with a CANCEL.

``RecentlyCancelled`` keeps the last ``LIMIT`` such ids, oldest forgotten first.  By
then a MOVED of the oldest has long arrived: a steal's answer is one message away.

Ownership: the backend's ``lock`` (every caller holds it: cancel.py, pump.py's MOVED,
stopped.py); no lock of its own.

Rejected: an unbounded set (a pilot lives for millions of cancels); clearing the set
when it is full (a fresh cancel forgotten at once: the thief runs the task).
"""

from __future__ import annotations


class RecentlyCancelled:
    """The last ``LIMIT`` ids cancelled or renamed by the driver (under ``lock``)."""

    LIMIT = 4096

    def __init__(self):
        self._ids: dict[int, None] = {}  # oldest first (insertion order)

    def add(self, tid: int) -> None:
        ids = self._ids
        ids[tid] = None
        if len(ids) > self.LIMIT:
            ids.pop(next(iter(ids)))

    def __contains__(self, tid: int) -> bool:
        return tid in self._ids

    def __len__(self) -> int:
        return len(self._ids)
