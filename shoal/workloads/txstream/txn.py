"""Events, the transaction recorder, and the one function that applies an update.

An event is ``Event(fn, ev)``: ``fn(txn, ev)`` *declares* the transaction's
state accesses through ``txn.update(table, key, fn, guard=, reads=)``; it
must not read state itself and must declare the same accesses every time it
is called with the same ``ev`` (the schedulers record a transaction more than
once, in different processes: that is how planning is spread over workers).

Semantics (the definition of correct, the serial oracle implements it
literally): transactions take effect in stream order; a transaction's
updates apply in declaration order; ``fn`` and ``guard`` get the current
value of their own key followed by the current values of their ``reads``, as
of that point of the serial order (the transaction's own earlier updates
included); a guard returning False, or an ``fn``/``guard`` raising, aborts
the whole transaction (none of its updates take effect).

A recorded operation is the tuple ``(gid, fn, guard, read_gids)``; global key
ids come from ``Store.layout``.  Bad declarations (unknown table, key out of
range or not an integer) raise ``TxnError`` naming the event; results that are
not integers, or overflow int64, raise it too.
"""

from __future__ import annotations

import enum
import numbers
import pickle
import time
import traceback
from typing import Any, Callable, NamedTuple

import numpy as np

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class Event(NamedTuple):
    """One stream event: ``fn(txn, ev)`` declares its transaction; ``ev`` is plain picklable data."""

    fn: Callable
    ev: Any


class OnError(enum.Enum):
    """What a transaction that raises (or declares a bad access) does to the run."""

    STOP = "stop"    # the run stops with TxnError; the store stays at the last punctuation
    ABORT = "abort"  # the transaction aborts, its error is recorded in report.errors; the stream goes on


class TxnError(Exception):
    """A transaction failed (bad declaration, UDF raised, non-integer result): names the event."""

    def __init__(self, seq: int, message: str):
        super().__init__(f"event {seq}: {message}")
        self.seq = seq
        self.message = message


class _BadAccess(Exception):
    pass


def _bad_table(layout: dict, table) -> _BadAccess:
    return _BadAccess(f"unknown table {table!r} (tables: {', '.join(layout)})")


def _checked_key(table, key, size: int) -> int:
    """The slow path of a key check (not a plain int in range): the int, or ``_BadAccess``."""
    if type(key) is not int:
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise _BadAccess(f"key {key!r} of table {table!r} is not an integer")
        key = int(key)
    if not 0 <= key < size:
        raise _BadAccess(f"key {key} out of range for table {table!r} (size {size})")
    return key


def _read_gids(layout: dict, reads) -> list:
    rg = []
    try:
        for t, k in reads:
            try:
                base, size = layout[t]
            except (KeyError, TypeError):
                raise _bad_table(layout, t) from None
            if type(k) is not int or not 0 <= k < size:
                k = _checked_key(t, k, size)
            rg.append(base + k)
    except (TypeError, ValueError):
        raise _BadAccess(f"reads must be a list of (table, key) pairs, got {reads!r}") from None
    return rg


def _bad_callables(table, key, fn, guard) -> _BadAccess:
    return _BadAccess(f"the update of {table!r}[{key!r}] needs callables, got fn={fn!r}, "
                      f"guard={guard!r}")


class Txn:
    """The recorder passed to an event's ``fn``: collects the declared updates as tuples
    (the serial oracle, the locking baselines and the replicated plan read them so)."""

    __slots__ = ("_layout", "ops")

    def __init__(self, layout: dict):
        self._layout = layout
        self.ops: list = []

    def update(self, table: str, key: int, fn: Callable, *, guard: Callable | None = None,
               reads=()) -> None:
        """Declare ``table[key] = fn(table[key], *reads)`` if ``guard(same values)`` (else abort)."""
        if not callable(fn) or (guard is not None and not callable(guard)):
            raise _bad_callables(table, key, fn, guard)
        layout = self._layout
        try:
            base, size = layout[table]
        except (KeyError, TypeError):
            raise _bad_table(layout, table) from None
        if type(key) is not int or not 0 <= key < size:
            key = _checked_key(table, key, size)
        self.ops.append((base + key, fn, guard, tuple(_read_gids(layout, reads)) if reads else ()))


class ArrayTxn:
    """The recorder of a whole slice of transactions into flat columns (split planning):
    per operation its key, fn, guard and read count, the reads' keys in one flat list, and
    where each transaction's operations end.  ``record(t, fn, ev)`` records one transaction;
    a declaration that fails leaves no operation behind (``bad[t]``: why).  ``arrays()``
    gives the numeric columns as numpy arrays, per transaction too (operation count, read
    count, "has a guard"); only fn and guard stay Python objects.  (Rejected: one ``Txn``
    and a list of op tuples per transaction, unpacked again into the shared arrays
    operation by operation — the largest planning cost measured.)"""

    __slots__ = ("_layout", "gid", "fn", "guard", "nreads", "rgid", "ends", "guarded", "bad")

    def __init__(self, layout: dict):
        self._layout = layout
        self.gid: list = []
        self.fn: list = []
        self.guard: list = []
        self.nreads: list = []
        self.rgid: list = []
        self.ends: list = []     # per transaction: one past its last operation
        self.guarded: list = []  # operations with a guard
        self.bad: dict = {}

    def update(self, table: str, key: int, fn: Callable, *, guard: Callable | None = None,
               reads=()) -> None:
        """``Txn.update``, appended to the columns."""
        if not callable(fn) or (guard is not None and not callable(guard)):
            raise _bad_callables(table, key, fn, guard)
        layout = self._layout
        try:
            base, size = layout[table]
        except (KeyError, TypeError):
            raise _bad_table(layout, table) from None
        if type(key) is not int or not 0 <= key < size:
            key = _checked_key(table, key, size)
        if reads:
            rg = _read_gids(layout, reads)
            self.rgid.extend(rg)
            self.nreads.append(len(rg))
        else:
            self.nreads.append(0)
        if guard is not None:
            self.guarded.append(len(self.gid))
        self.gid.append(base + key)
        self.fn.append(fn)
        self.guard.append(guard)

    def record(self, t: int, fn: Callable, ev) -> None:
        """Record transaction ``t`` (its number in the batch, for ``bad``)."""
        try:
            fn(self, ev)
        except Exception as exc:  # noqa: BLE001 - a bad declaration or the user's fn raised
            self._drop(t, exc, fn)
        self.ends.append(len(self.gid))

    def _drop(self, t: int, exc: Exception, fn) -> None:
        """Transaction t's declaration failed: its error, and none of its operations."""
        if isinstance(exc, _BadAccess):
            self.bad[t] = str(exc)
        else:
            self.bad[t] = describe(exc, f"declaring the transaction ({getattr(fn, '__name__', fn)!r})")
        n0 = self.ends[-1] if self.ends else 0
        del self.rgid[len(self.rgid) - sum(self.nreads[n0:]):]
        for col in (self.gid, self.fn, self.guard, self.nreads):
            del col[n0:]
        while self.guarded and self.guarded[-1] >= n0:
            self.guarded.pop()

    def arrays(self) -> dict:
        """The numeric columns as int64/int8 arrays, per operation and per transaction."""
        i8 = np.int64
        ends = np.asarray(self.ends, i8)
        starts = np.concatenate(([0], ends[:-1])).astype(i8)
        nreads = np.asarray(self.nreads, i8)
        op_rend = np.cumsum(nreads)
        rend = np.where(ends > 0, op_rend[np.maximum(ends - 1, 0)] if len(nreads) else 0, 0)
        rstart = np.concatenate(([0], rend[:-1])).astype(i8)
        guarded = np.zeros(len(ends), np.int8)
        if self.guarded:
            guarded[np.searchsorted(ends, np.asarray(self.guarded, i8), "right")] = 1
        return {"gid": np.asarray(self.gid, i8), "nreads": nreads,
                "rgid": np.asarray(self.rgid, i8), "txn_nops": ends - starts,
                "txn_nreads": rend - rstart, "txn_guard": guarded}


def record(fn: Callable, ev, layout: dict) -> list:
    """The operations event ``ev`` declares; raises ``_BadAccess``/the user's exception."""
    txn = Txn(layout)
    fn(txn, ev)
    return txn.ops


def record_or_error(fn, ev, layout):
    """``(ops, None)`` or ``([], message)`` when the declaration itself fails."""
    try:
        return record(fn, ev, layout), None
    except _BadAccess as exc:
        return [], str(exc)
    except Exception as exc:  # the user's fn raised while declaring
        return [], describe(exc, f"declaring the transaction ({getattr(fn, '__name__', fn)!r})")


class Guarded(Exception):
    """The guard returned False: the transaction aborts (not an error)."""


def apply(fn, guard, vals: list) -> int:
    """One update: the guard, then fn, then the integer check.  Raises Guarded or the error."""
    if guard is not None and not guard(*vals):
        raise Guarded
    new = fn(*vals)
    if type(new) is not int:
        if isinstance(new, bool) or not isinstance(new, numbers.Integral):
            raise TypeError(f"an update must return an integer, got {new!r} "
                            f"({type(new).__name__}) from {getattr(fn, '__qualname__', fn)}")
        new = int(new)
    if not INT64_MIN <= new <= INT64_MAX:
        raise OverflowError(f"an update returned {new}, which does not fit int64")
    return new


def describe(exc: BaseException, where: str = "") -> str:
    """A one-line error for report.errors, with the innermost frame of the user's code."""
    tb = traceback.extract_tb(exc.__traceback__)
    frame = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    prefix = f"{where}: " if where else ""
    return f"{prefix}{type(exc).__name__}: {exc}{frame}"


def spin(us: float) -> None:
    """Busy-wait ``us`` microseconds: MorphStream's per-access "complexity" knob."""
    if us > 0:
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass


def key_name(layout: dict, gid: int) -> str:
    """``table[key]`` for a global key id (for error messages)."""
    for name, (base, size) in layout.items():
        if base <= gid < base + size:
            return f"{name}[{gid - base}]"
    return f"key {gid}"


def dumps_events(batch: list, columns: bool = False) -> bytes:
    """One pickle of the batch; by value (cloudpickle) where a function would not import on a
    worker: a function of ``__main__`` (plain pickle would name the worker's own __main__).
    ``columns``: as ``(fns, evs)``, two lists (``area.load_events`` reads that form): no
    ``Event`` tuple is pickled per event, and a batch of few distinct functions pickles
    each once."""
    obj = ([e.fn for e in batch], [e.ev for e in batch]) if columns else batch
    if any(getattr(fn, "__module__", None) == "__main__" for fn in {e.fn for e in batch}):
        import cloudpickle

        return cloudpickle.dumps(obj, 5)
    try:
        return pickle.dumps(obj, 5)
    except Exception:
        import cloudpickle  # lambdas, closures

        return cloudpickle.dumps(obj, 5)


def unpicklable(batch: list, seq0: int, exc: Exception) -> TypeError:
    """The error for a batch that does not pickle, naming the first event that does not
    (else only pickle's message: "cannot pickle '_thread.lock' object", no event)."""
    import cloudpickle

    for t, event in enumerate(batch):
        try:
            cloudpickle.dumps(event, 5)
        except Exception as one:  # noqa: BLE001 - reported, with the event's number
            return TypeError(f"event {seq0 + t}: cannot be pickled for the workers: {one!r} "
                             f"(fn={getattr(event.fn, '__qualname__', event.fn)!s:.60}); "
                             "an event's ev must be plain picklable data")
    return TypeError(f"events {seq0}..{seq0 + len(batch) - 1} cannot be pickled for the "
                     f"workers: {exc!r}")
