"""The local backend's locks, their one order, and the check that they are taken in it.

Every lock of a ``LocalBackend`` and of its components is made here (``make``) with a
``Rank``; a thread may take a lock only while every lock it holds has a lower rank
(re-taking a re-entrant lock it holds is fine).  The order, lowest first:

1. ``CLOSE`` — ``close_lock``: one ``close()`` at a time (the exit handler and a
   collected pilot's closer may race);
2. ``EXPORT`` — ``export_lock``: one ``export()`` at a time (the dask balancer);
3. ``CONSUME`` — ``consume_lock`` (re-entrant): the consumer side of the worker→driver
   rings, held by the pump's drain or a ``cancel()`` draining to its marks, and by a
   death's handling (pump.py, cancel.py, lifecycle.py);
4. ``TABLE`` — ``lock``: the producer side of the driver→worker rings and the driver's
   task table (``tasks``, ``staged``, ``waiting``, placement);
5. ``LEAF`` — each component's own lock (replies.py, timers.py): taken last, and no
   other lock is taken while one is held.

``Future._lock`` (shoal/runtime/future.py) comes after all of them (futures are settled
under ``lock``, pump.py); it is the runtime's and is not wrapped here.

How the order is checked: in normal use ``make`` returns a plain ``threading.Lock`` or
``RLock`` (no cost on any path).  Inside ``checking()`` (tests) it returns a wrapper that
keeps, per thread, the locks held and records every acquisition that breaks the order
(``LockOrder.violations``) and every pair seen nested (``LockOrder.pairs``).  A test runs
a backend through its paths (tests/backends/test_local_components.py) and asserts no
violation and the pairs it expects.  A violation is recorded, not raised: raised in the
pump thread it would be swallowed by the pump's own error handling.

Rejected: a static check of the nesting (``with`` blocks span calls into other modules:
what a call takes is known only at run time); the order checked by every production
acquisition (a thread-local stack per acquisition on the submit path); a docstring
alone (what this replaces: a convention nobody could check).
"""

from __future__ import annotations

import contextlib
import threading
from enum import IntEnum


class Rank(IntEnum):
    """Where a lock stands in the order: a thread takes locks of rising rank only."""

    CLOSE = 10
    EXPORT = 20
    CONSUME = 30
    TABLE = 40
    LEAF = 50


class LockOrder:
    """What a ``checking()`` block saw: order violations and the nested pairs."""

    def __init__(self):
        self.violations: list[tuple[str, str]] = []  # (held, taken) against the order
        self.pairs: set[tuple[str, str]] = set()  # (held, taken) seen nested
        self._held = threading.local()
        self._mutex = threading.Lock()

    def held(self) -> list:
        stack = getattr(self._held, "stack", None)
        if stack is None:
            stack = self._held.stack = []
        return stack

    def note(self, held: list, lock: _Checked) -> None:
        with self._mutex:
            for h in held:
                if h is lock:
                    continue
                self.pairs.add((h.name, lock.name))
                if h.rank >= lock.rank:
                    self.violations.append((h.name, lock.name))


_order: LockOrder | None = None  # set inside checking()


class _Checked:
    """A lock that reports to a ``LockOrder`` (tests only)."""

    __slots__ = ("_lock", "name", "rank", "_order", "_reentrant")

    def __init__(self, lock, name: str, rank: Rank, order: LockOrder, reentrant: bool):
        self._lock = lock
        self.name = name
        self.rank = rank
        self._order = order
        self._reentrant = reentrant

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        held = self._order.held()
        if blocking and not (self._reentrant and self in held):
            self._order.note(held, self)  # a try-lock cannot deadlock: only blocking ones
        got = self._lock.acquire(blocking, timeout)
        if got:
            held.append(self)
        return got

    def release(self) -> None:
        held = self._order.held()
        for i in range(len(held) - 1, -1, -1):
            if held[i] is self:
                del held[i]
                break
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked() if hasattr(self._lock, "locked") else False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def make(name: str, rank: Rank, reentrant: bool = False):
    """A new lock at ``rank`` (checked inside ``checking()``, plain otherwise)."""
    lock = threading.RLock() if reentrant else threading.Lock()
    if _order is None:
        return lock
    return _Checked(lock, name, rank, _order, reentrant)


def condition(name: str):
    """A condition over a new leaf lock (``Rank.LEAF``)."""
    return threading.Condition(make(name, Rank.LEAF))


@contextlib.contextmanager
def checking():
    """Backends made inside this block check their lock order into the yielded ``LockOrder``."""
    global _order
    previous, _order = _order, LockOrder()
    try:
        yield _order
    finally:
        _order = previous
