"""``Pilot.map``: a lazy, bounded, adaptively batched map over any backend.

Data flow: items are pulled from the input iterables only as batches are
submitted; at most ``window`` batches are in flight, so mapping over a
generator of 10 million items holds a few thousand at a time.  Each batch is
one task that runs ``fn`` over its items and reports how long that took; the
batch size then follows the measured time per item so that a batch lasts about
``TARGET_S`` (large enough to hide the per-task cost, small enough to balance),
capped by ``len(input) / (4 * workers)`` when the length is known (what
``multiprocessing.Pool.map`` does) and by ``MAX_BATCH``.  The first batches
hold ``FIRST_BATCH`` items, so a slow function is not handed out in big lumps
before its cost is known.

Rejected: materialising the input (unbounded memory); a fixed chunk size
(Pool.map's: right only when the length is known and items cost the same).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import time
from collections import deque

TARGET_S = 0.005
FIRST_BATCH = 128  # items in the first batches, before any duration was measured
MAX_BATCH = 65536


class Batch(list):
    """A batch of map items.  Its own type, so the dependency scan of ``submit``
    (which looks for Futures inside plain lists) skips it: map items are data."""

    __slots__ = ()


def _batch_runner(fn, star: bool):
    """A per-map function that runs ``fn`` over a batch (sent once per worker, then cached)."""

    if star:
        def run_batch(items):
            t0 = time.perf_counter()
            out = list(itertools.starmap(fn, items))
            return out, time.perf_counter() - t0
    else:
        def run_batch(items):
            t0 = time.perf_counter()
            out = list(map(fn, items))
            return out, time.perf_counter() - t0

    run_batch.__qualname__ = f"map[{getattr(fn, '__qualname__', type(fn).__name__)}]"
    return run_batch


def map_iter(backend, fn, iterables, *, ordered: bool = True, chunksize: int | None = None):
    if not callable(fn):
        raise TypeError(f"map() needs a callable, got {type(fn).__name__} {fn!r}")
    if chunksize is not None and (isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1):
        raise ValueError(f"chunksize must be an int >= 1 or None, got chunksize={chunksize!r}")
    if not iterables:
        raise TypeError("map() needs at least one iterable")
    workers = max(1, backend.n)
    try:
        total = min(len(it) for it in iterables)
    except TypeError:
        total = None
    cap = MAX_BATCH if total is None else max(1, min(MAX_BATCH, -(-total // (4 * workers))))
    star = len(iterables) > 1
    items = zip(*iterables, strict=False) if star else iter(iterables[0])  # like map(): shortest wins
    runner = _batch_runner(fn, star)
    first = min(cap, FIRST_BATCH)
    return MapIterator(_batches(backend, runner, items, ordered, chunksize, first, cap, 2 * workers + 2))


class MapIterator:
    """The iterator ``Pilot.map`` returns: results item by item, closable.

    ``for``/``list``/``sum`` get an ``itertools.chain`` over the result batches
    (``__iter__``), so the per-item cost is C code, not a generator resumption
    per item; ``next()`` works too.  ``close()`` (or garbage collection) cancels
    the batches still in flight.
    """

    __slots__ = ("_batches", "_items")

    def __init__(self, batches):
        self._batches = batches
        self._items = itertools.chain.from_iterable(batches)

    def __iter__(self):
        return self._items

    def __next__(self):
        return next(self._items)

    def close(self) -> None:
        self._batches.close()


def _batches(backend, runner, items, ordered, chunksize, first, cap, window):
    """Yield lists of results, batch by batch, keeping ``window`` batches in flight."""
    size = chunksize or first
    inflight: deque = deque()
    pending: set = set()
    exhausted = False
    per_item = None
    try:
        while True:
            while not exhausted and len(inflight) < window:
                batch = Batch(itertools.islice(items, size))
                if not batch:
                    exhausted = True
                    break
                fut = backend.submit(runner, (batch,), {})
                inflight.append(fut)
                pending.add(fut)
            if not inflight:
                return
            if ordered:
                fut = inflight.popleft()
            else:
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                fut = done.pop()
                inflight.remove(fut)
            pending.discard(fut)
            results, elapsed = fut.result()
            if chunksize is None and results:
                sample = elapsed / len(results)
                per_item = sample if per_item is None else 0.7 * per_item + 0.3 * sample
                size = max(1, min(cap, int(TARGET_S / max(per_item, 1e-9))))
            yield results
    finally:
        for fut in inflight:
            fut.cancel()
