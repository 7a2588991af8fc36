"""``Pilot.map``: a lazy, bounded, adaptively batched map over any backend.

Data flow: ``map()`` pulls items from the input iterables and submits the first
batches at once (work starts at call time, as ``Executor.map``'s does); the
rest are pulled only as results are consumed.  In flight are at most
``window`` batches *and* at most ``window_bytes`` bytes of pickled input, so
mapping over a generator of 10 million items, or of 200,000 items of 10 KB,
holds a bounded slice of it in the driver and in the workers.  Each batch is
pickled once, here (that is how its size is known), and travels as those bytes.

Each batch is one task that runs ``fn`` over its items and reports how long
that took; the batch size then follows the measured time per item so that a
batch lasts about ``TARGET_S`` (large enough to hide the per-task cost, small
enough to balance), capped by ``len(input) / (4 * workers)`` when the length
is known (what ``multiprocessing.Pool.map`` does), by ``MAX_BATCH`` items and
by the batch's share of ``window_bytes``.  The first batches hold
``FIRST_BATCH`` items, so a slow function is not handed out in big lumps
before its cost is known.

Failure: a batch stops at its first failing item and returns the results
before it with the error, so the iterator yields every result up to the
failing item, then raises its exception (with the worker's traceback as
``__cause__``), then cancels the batches still in flight.  ``timeout`` is
measured from the call, as ``Executor.map``'s: past it, ``next()`` raises
``concurrent.futures.TimeoutError`` and the rest is cancelled.

Rejected: materialising the input (unbounded memory); a fixed chunk size
(Pool.map's: right only when the length is known and items cost the same);
one future per item (the stdlib's: microseconds of driver work per item);
bounding by items only (10 KB items made the window gigabytes).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import pickle
import time
import traceback
from collections import deque

from .._errors import RemoteTraceback
from . import wire

TARGET_S = 0.005
FIRST_BATCH = 128  # items in the first batches, before any duration was measured
MAX_BATCH = 65536
WINDOW_BYTES = 64 << 20  # default bound on the pickled input in flight (the ``window_bytes`` knob)

_repeat = itertools.repeat
_starmap = itertools.starmap


class Batch:
    """A batch of map items, pickled once when it is made (its size counts against
    ``window_bytes``).  Its own type, so the dependency scan of ``submit`` (which
    looks for Futures inside plain lists) skips it: map items are data.  It
    unpickles as the plain list of its items."""

    __slots__ = ("blob", "n")

    def __init__(self, items: list, fn):
        self.n = len(items)
        self.blob = wire.dump_args((items,), {}, fn)  # pickle, or cloudpickle where it must

    def __len__(self) -> int:
        return self.n

    def __reduce__(self):
        return _load_batch, (self.blob,)


def _load_batch(blob: bytes) -> list:
    (items,), _ = pickle.loads(blob)
    return items


def _batch_runner(fn, star: bool, catch: bool):
    """A per-map function that runs ``fn`` over a batch (sent once per worker, then cached).

    Returns ``(results, seconds, error)``: ``error`` is None, or ``(exception,
    formatted traceback)`` of the first failing item, ``results`` the items
    before it (``catch``; with retries the batch fails whole and is re-run)."""

    apply = itertools.starmap if star else map

    def run_batch(items):
        t0 = time.perf_counter()
        if not catch:
            out = list(apply(fn, items))
            return out, time.perf_counter() - t0, None
        out = []
        try:
            out.extend(apply(fn, items))
        except Exception as exc:  # noqa: BLE001 - travels back with the results before it
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return out, time.perf_counter() - t0, (exc, tb)
        return out, time.perf_counter() - t0, None

    run_batch.__qualname__ = f"map[{getattr(fn, '__qualname__', type(fn).__name__)}]"
    return run_batch


def check_map_args(fn, iterables, chunksize, timeout, window_bytes) -> None:
    if not callable(fn):
        raise TypeError(f"map() needs a callable, got {type(fn).__name__} {fn!r}")
    if chunksize is not None and (isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1):
        raise ValueError(f"chunksize must be an int >= 1 or None, got chunksize={chunksize!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise TypeError(f"timeout must be a number of seconds or None, got timeout={timeout!r}")
    if window_bytes is not None and (isinstance(window_bytes, bool) or not isinstance(window_bytes, int)
                                     or window_bytes < 1):
        raise ValueError(f"window_bytes must be an int >= 1 or None, got window_bytes={window_bytes!r}")
    if not iterables:
        raise TypeError("map() needs at least one iterable")


def map_iter(backend, fn, iterables, *, ordered: bool = True, chunksize: int | None = None,
             timeout: float | None = None, window_bytes: int | None = None, submit=None,
             catch: bool = True):
    """Start mapping ``fn`` over ``iterables`` on ``backend``; returns a ``MapIterator``.

    ``submit(runner, args, kwargs)`` defaults to ``backend.submit`` (a caller
    passes its own to add per-task options such as retries)."""
    check_map_args(fn, iterables, chunksize, timeout, window_bytes)
    deadline = None if timeout is None else time.monotonic() + timeout
    workers = max(1, backend.n)
    try:
        total = min(len(it) for it in iterables)
    except TypeError:
        total = None
    cap = MAX_BATCH if total is None else max(1, min(MAX_BATCH, -(-total // (4 * workers))))
    star = len(iterables) > 1
    items = zip(*iterables, strict=False) if star else iter(iterables[0])  # like map(): shortest wins
    runner = _batch_runner(fn, star, catch)
    run = _MapRun(submit or backend.submit, runner, fn, items, ordered, chunksize,
                  min(cap, FIRST_BATCH), cap, 2 * workers + 2, window_bytes or WINDOW_BYTES, deadline)
    run.fill()  # work starts now, not at the first next()
    return MapIterator(run)


class MapIterator:
    """The iterator ``Pilot.map`` returns: results item by item, closable.

    ``for``/``list``/``sum`` get an ``itertools.chain`` over the result batches
    (``__iter__``), so the per-item cost is C code, not a generator resumption
    per item; ``next()`` works too.  A batch's list is consumed by popping, so a
    result the caller dropped is freed at once (no reference stays here).
    ``close()`` (or garbage collection) cancels the batches still in flight.
    """

    __slots__ = ("_run", "_batches", "_items")

    def __init__(self, run):
        self._run = run
        self._batches = run.batches()
        self._items = itertools.chain.from_iterable(self._batches)

    def __iter__(self):
        return self._items

    def __next__(self):
        return next(self._items)

    def close(self) -> None:
        self._batches.close()
        self._run.cancel()


class _MapRun:
    """The state of one map: input, batches in flight, sizing (the consumer's thread only)."""

    def __init__(self, submit, runner, fn, items, ordered, chunksize, first, cap, window,
                 window_bytes, deadline):
        self.submit, self.runner, self.fn, self.items = submit, runner, fn, items
        self.ordered, self.chunksize, self.cap = ordered, chunksize, cap
        self.size = chunksize or first
        self.window, self.window_bytes, self.deadline = window, window_bytes, deadline
        self.batch_bytes = max(1, window_bytes // window)  # a batch's share of the window
        self.item_bytes = None  # pickled bytes per item, measured on the batches made so far
        self.per_item = None  # seconds per item, measured by the workers
        self.inflight: deque = deque()  # (future, bytes)
        self.pending: set = set()
        self.bytes = 0
        self.exhausted = False

    def fill(self) -> None:
        """Submit batches until the window is full (in batches or in bytes) or the input ends."""
        inflight = self.inflight
        while not self.exhausted and len(inflight) < self.window and (
                not inflight or self.bytes < self.window_bytes):
            size = self.size
            if self.item_bytes and self.chunksize is None:
                size = max(1, min(size, int(self.batch_bytes / self.item_bytes)))
            chunk = list(itertools.islice(self.items, size))
            if not chunk:
                self.exhausted = True
                return
            batch = Batch(chunk, self.fn)
            del chunk
            n = len(batch.blob)
            sample = n / batch.n
            self.item_bytes = sample if self.item_bytes is None else max(sample, 0.5 * self.item_bytes)
            fut = self.submit(self.runner, (batch,), {})
            inflight.append((fut, n))
            self.pending.add(fut)
            self.bytes += n

    def _left(self):
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def batches(self):
        """Yield an iterator over each batch's results, keeping the window full."""
        try:
            while True:
                self.fill()
                if not self.inflight:
                    return
                if self.ordered:
                    fut, n = self.inflight[0]
                    results = fut.result(self._left())  # cf.TimeoutError past the deadline
                    self.inflight.popleft()
                else:
                    done, _ = cf.wait(self.pending, timeout=self._left(), return_when=cf.FIRST_COMPLETED)
                    if not done:
                        raise cf.TimeoutError("map() did not finish within its timeout")
                    fut = done.pop()
                    i = next(i for i, entry in enumerate(self.inflight) if entry[0] is fut)
                    n = self.inflight[i][1]
                    del self.inflight[i]
                    results = fut.result()
                self.pending.discard(fut)
                self.bytes -= n
                del fut
                out, elapsed, err = results
                del results
                if self.chunksize is None and out:
                    sample = elapsed / len(out)
                    per = self.per_item
                    self.per_item = per = sample if per is None else 0.7 * per + 0.3 * sample
                    self.size = max(1, min(self.cap, int(TARGET_S / max(per, 1e-9))))
                if err is not None:
                    exc, tb = err
                    exc.__cause__ = RemoteTraceback(tb)
                    if out:
                        yield _drain(out)
                    raise exc
                yield _drain(out)
        finally:
            self.cancel()

    def cancel(self) -> None:
        inflight, self.inflight = self.inflight, deque()
        for fut, _ in inflight:
            fut.cancel()
        self.pending = set()
        self.bytes = 0


def _drain(out: list):
    """An iterator that pops ``out`` item by item (in C), so nothing keeps a yielded result."""
    out.reverse()
    return _starmap(out.pop, _repeat((), len(out)))
