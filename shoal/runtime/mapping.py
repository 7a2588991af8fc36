"""``Pilot.map``: a lazy, bounded, adaptively batched map over any backend.

Data flow: ``map()`` pulls items from the input iterables and submits the first
batches at once (work starts at call time, as ``Executor.map``'s does); the
rest are pulled only as results are consumed.  In flight are at most
``window`` batches *and* at most ``window_bytes`` bytes of pickled input, so
mapping over a generator of 10 million items, or of 200,000 items of 10 KB,
holds a bounded slice of it in the driver and in the workers.  Each batch is
pickled once, here (that is how its size is known), and travels as those bytes.

Each batch is one task that runs ``fn`` over its items and reports how long
that took; the batch size (``batch_size``, a pure policy) then follows the
measured time per item so that a batch lasts about ``TARGET_S``, capped by
``len(input) / (4 * workers)`` when the length is known (what
``multiprocessing.Pool.map`` does), by ``MAX_BATCH`` items and by a byte budget:
the batch's share of ``window_bytes`` and, where the backend passes
``record_bytes``, what travels as one record of its transport (the local
backend: half a ring record, 128 KiB).  The first batches hold ``FIRST_BATCH``
items, so a slow function is not handed out in big lumps before its cost is
known; a batch over the byte budget (its items were bigger than the ones
before) is cut before it is sent.

Where the time goes (``benchmarks/run.py --only map_defaults``; the figures are in
docs/benchmarks.md): for tiny items the driver is the bottleneck -- pickling the input
and unpickling the results cost more than the work -- and a batch bigger than a ring
record is cut into fragments and reassembled, which made such maps slower than the best
fixed ``chunksize``; the byte budget keeps every batch one record.  For items of ~1 ms
the workers are the bottleneck and the per-batch cost is what counts: batches of
``TARGET_S`` keep each worker busy nearly all the time, and are still short enough that
the last batch does not leave a worker idle for long; three batches queued per worker
also ride out a driver that another process keeps off the CPU for a few time slices.

Failure: a batch stops at its first failing item and returns the results
before it with the error, so the iterator yields every result up to the
failing item, then raises its exception (with the worker's traceback as
``__cause__``), then cancels the batches still in flight.  ``timeout`` is
measured from the call, as ``Executor.map``'s: past it, ``next()`` raises
``concurrent.futures.TimeoutError`` and the rest is cancelled.

Rejected: materialising the input (unbounded memory); a fixed chunk size
(Pool.map's: right only when the length is known and items cost the same);
bigger batches for tiny items (past a ring record they got slower, not faster);
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

TARGET_S = 0.02  # seconds of work a batch should take
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


def batch_cap(total: int | None, workers: int) -> int:
    """The most items a batch of this map may hold: ``MAX_BATCH``, and, when the input's
    length is known, ``ceil(total / (4 * workers))`` (at least four batches per worker,
    ``Pool.map``'s rule, so the workers finish together)."""
    return MAX_BATCH if total is None else max(1, min(MAX_BATCH, -(-total // (4 * workers))))


def batch_size(per_item_s: float | None, item_bytes: float | None, cap: int,
               batch_bytes: float) -> int:
    """The adaptive batch size, a pure policy: how many items the next batch holds.

    ``per_item_s``: the workers' measured seconds per item (None before the first
    batch came back: then ``FIRST_BATCH``); ``item_bytes``: the pickled bytes per item
    measured so far (None before the first batch was made); ``cap``: ``batch_cap``'s
    answer; ``batch_bytes``: a batch's share of ``window_bytes``.  About ``TARGET_S``
    of work, at most ``cap`` items and ``batch_bytes`` bytes, at least one item."""
    size = FIRST_BATCH if per_item_s is None else int(TARGET_S / max(per_item_s, 1e-9))
    if item_bytes:
        size = min(size, int(batch_bytes / item_bytes))
    return max(1, min(cap, size))


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
             catch: bool = True, record_bytes: int | None = None):
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
    cap = batch_cap(total, workers)
    star = len(iterables) > 1
    items = zip(*iterables, strict=False) if star else iter(iterables[0])  # like map(): shortest wins
    runner = _batch_runner(fn, star, catch)
    run = _MapRun(submit or backend.submit, runner, fn, items, ordered, chunksize,
                  cap, 2 * workers + 2, window_bytes or WINDOW_BYTES, deadline, record_bytes)
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

    def __init__(self, submit, runner, fn, items, ordered, chunksize, cap, window,
                 window_bytes, deadline, record_bytes=None):
        self.submit, self.runner, self.fn, self.items = submit, runner, fn, items
        self.ordered, self.chunksize, self.cap = ordered, chunksize, cap
        self.window, self.window_bytes, self.deadline = window, window_bytes, deadline
        self.batch_bytes = max(1, window_bytes // window)  # a batch's share of the window
        if record_bytes is not None:  # and it travels as one record of the transport
            self.batch_bytes = min(self.batch_bytes, record_bytes)
        self.item_bytes = None  # pickled bytes per item, measured on the batches made so far
        self.per_item = None  # seconds per item, measured by the workers
        self.inflight: deque = deque()  # (future, bytes)
        self.pending: set = set()
        self.bytes = 0
        self.exhausted = False
        self.back: list = []  # items of a batch that was cut, to go out before the input's

    def fill(self) -> None:
        """Submit batches until the window is full (in batches or in bytes) or the input ends."""
        inflight = self.inflight
        while not self.exhausted and len(inflight) < self.window and (
                not inflight or self.bytes < self.window_bytes):
            size = self.chunksize or batch_size(self.per_item, self.item_bytes, self.cap,
                                                self.batch_bytes)
            chunk = self._take(size)
            if not chunk:
                self.exhausted = True
                return
            batch = Batch(chunk, self.fn)
            n = len(batch.blob)
            while True:
                sample = n / batch.n
                self.item_bytes = sample if self.item_bytes is None else max(sample, 0.5 * self.item_bytes)
                if self.chunksize is not None or n <= self.batch_bytes or batch.n == 1:
                    break
                # sized before its items' size was known (the first batch) or with items
                # bigger than the ones before: cut to what fits the byte budget (fewer
                # items: sample > budget / items); the rest goes back in front of the input
                fit = int(self.batch_bytes / sample) or 1
                self.back[:0] = chunk[fit:]
                del chunk[fit:]
                batch = Batch(chunk, self.fn)
                n = len(batch.blob)
            del chunk
            fut = self.submit(self.runner, (batch,), {})
            inflight.append((fut, n))
            self.pending.add(fut)
            self.bytes += n

    def _take(self, size: int) -> list:
        """The next ``size`` items: those a cut batch gave back first, then the input's."""
        back = self.back
        if not back:
            return list(itertools.islice(self.items, size))
        chunk = back[:size]
        del back[:size]
        if len(chunk) < size:
            chunk.extend(itertools.islice(self.items, size - len(chunk)))
        return chunk

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
                    self.per_item = sample if per is None else 0.7 * per + 0.3 * sample
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
