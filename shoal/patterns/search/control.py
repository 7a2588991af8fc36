"""What the tasks of one search share while it runs: the Control array and the stop flag.

Control is a ``SharedArray.per_node(pilot, (workers + 1, CONTROL_COLUMNS), int64)``:
one row per process, each written only by its owner (row 0: the driver), so no
locks.  (Who is hungry is the runtime's to say: ``shoal.current_worker().hungry()``.)
The columns:

* ``SPAWNED`` / ``STARTED``: search tasks made / begun by this process;
  ``sum(SPAWNED) - sum(STARTED)`` tasks are on offer to thieves;
* ``STOP``: this machine's stop flag (a find() hit, an error, an interruption);
* ``NODES``: nodes visited so far (written at every poll: what ``progress=`` and
  the dashboard show).

Across machines the search's stop is a ``StopFlag``: raised once by whoever stops
the search (a task on any machine, the driver), read by every task every few polls.
It is built on the public ``shoal.BestCell.for_pilot`` (a value that only rises,
kept in step across machines), but a search names it by its role: nothing here is an
incumbent.  Rejected: a Channel message to every task (tasks do not listen); the
Control column alone (it is per machine).

Balancing between machines is the runtime's (the dask backend's balancer lends
spawned tasks from a busy machine to one whose workers are all hungry), not the
search's.  A task lent to another machine takes the search's shared objects with
it: the StopFlag and the incumbent are the same everywhere, Control is the
destination machine's (its rows say who works *there*; a moved task counts as
spawned on the lender and started on the borrower).  Hunger seen through Control
and ``hungry()`` is per machine, so on a pilot of several machines a running task
keeps ``RESERVE`` of its shallowest subtrees spawned (``Explorer.keep_reserve``):
that is what the balancer lends.  Rejected (the previous design): the driver
asking busy machines through a counter cell to export subtrees through a Channel
and submitting them itself -- a second balancer beside the runtime's, for search
tasks only, with its own exactly-once bookkeeping (docs/runtime.md, "Balancing
between machines: one owner").
"""

from __future__ import annotations

import concurrent.futures as cf

import shoal

from .model import Tally

SPAWNED, STARTED, STOP, NODES = range(4)
CONTROL_COLUMNS = 4
RESERVE = 2  # several machines: subtrees a running task keeps on offer for the balancer
STOP_WAIT_S = 10.0  # how long a stopped search waits for its tasks to unwind


def make_control(pilot):
    """A fresh Control array for one search on ``pilot`` (one copy per machine)."""
    return shoal.SharedArray.per_node(pilot, (pilot.workers + 1, CONTROL_COLUMNS), "int64", fill=0)


def slot(array) -> int:
    """The Control row of the calling process (0: the driver)."""
    w = shoal.current_worker()
    return 0 if w is None else w.id % len(array)


class StopFlag:
    """The search's stop flag on every machine: ``set()`` once, ``is_set()`` anywhere.

    Picklable (it travels in the search's spec); ``close()`` by its maker (the driver).
    """

    __slots__ = ("_cell",)

    def __init__(self, cell):
        self._cell = cell

    @classmethod
    def for_pilot(cls, pilot) -> StopFlag:
        return cls(shoal.BestCell.for_pilot(pilot, "max", initial=0.0))

    def set(self) -> None:
        self._cell.offer(1.0)

    def is_set(self) -> bool:
        return self._cell.value > 0

    def close(self) -> None:
        self._cell.close()

    def __reduce__(self):
        return (StopFlag, (self._cell,))


def stopped(stop: StopFlag | None, ctl) -> bool:
    """Has the search been stopped (on this machine, or anywhere through ``stop``)?"""
    return bool(ctl[:, STOP].any()) or (stop is not None and stop.is_set())


def stop_all(ctl, stop: StopFlag, pending) -> None:
    """Driver: stop the search everywhere and wait (up to ``STOP_WAIT_S``) for the
    ``pending`` futures to unwind; cancel those that do not."""
    ctl.array[0, STOP] = 1  # every task on this machine unwinds at its next poll
    stop.set()
    # (no cancel() first: a cancelled driver future never counts as done for wait())
    _, late = cf.wait(pending, timeout=STOP_WAIT_S)
    for f in late:
        f.cancel()


def wait_all(futs: list, ctl, stop, prog=None) -> Tally:
    """Driver: merge the tallies of ``futs``; on an error or an interruption stop every task."""
    tally, pending = Tally(tasks=0), set(futs)
    try:
        while pending:
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED,
                                    timeout=None if prog is None else prog.wait_s())
            for f in done:
                tally.merge(f.result())
            if prog is not None:
                prog.tick()
        return tally
    except BaseException:
        stop_all(ctl, stop, pending)
        raise
