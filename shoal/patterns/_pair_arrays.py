"""All-pairs over vectors already in memory: ``compute(pilot, X, block=...)`` on arrays.

When ``items`` is a numpy array (one item per row) and ``block`` is given, there
is nothing to load or cache: the problem is a matrix product-like sweep, and
the cost that matters is memory traffic.  So this path skips tiles, caches and
Z-order (``_pair_tasks``) and does the plain thing, well::

    driver: X -> one SharedArray (a single copy; workers map it, nothing pickled)
            out = SharedArray: condensed (n(n-1)/2, scipy's pdist order), square
                  (n x n) or rectangular (n x m)
            rows cut into STRIPS_PER_WORKER x workers strips of about equal
            *pairs* (a strip of the upper triangle is rows [i0, i1) x cols [i0, n))
    strip_task(i0, i1): D = block(X[i0:i1], X[i0:]) -> copied into out (condensed:
            row i's columns i+1.. are one contiguous run; square: D and its mirror)

Across hosts (the driver's shared memory reaches no worker there):
``rows_task`` gets its strip's rows and the columns it needs *by value*, returns
``D`` as its result, and the driver writes it (``place``, the same code as a
worker's).  Data out is the result itself, which no placement avoids; data in is
about ``strips / 2`` copies of ``X`` for the triangle, small beside the result
when the rows are short (n x n/2 values out against n x dims in per copy).

Invariants: every pair is written by exactly one strip (strips partition the
rows; a strip owns the columns right of its rows' diagonal); the driver
returns a view of ``out``, never a copy; ``block`` gets read-only views of the
shared inputs (strips read the same rows concurrently: a block writing its rows
in place would change other strips' inputs, so it is refused with a PairError).  A strip's temporary ``D`` is at most
about ``total pairs / strips`` values (plus the diagonal block).

Rejected: the tiled path for arrays (each tile a task message, a cache lookup
per item and a mirror write per tile: an order of magnitude slower than pdist);
letting workers
return their strips (n^2 floats through the rings); BLAS Gram-matrix distances
inside the skeleton (fast, but not exact: that choice belongs to the user's
``block``); across hosts, one copy of ``X`` per host made first (the pilot cannot
aim a task at a host, and a strip's rows are at most the ``X`` it would read there).
"""

from __future__ import annotations

import dataclasses
import time

import shoal

STRIPS_PER_WORKER = 16  # strips per worker: enough to even out a slow or shared core


@dataclasses.dataclass(frozen=True)
class StripJob:
    """What every strip task is given (small: the arrays travel as shared-memory handles)."""

    x: object  # SharedArray (n, ...)
    y: object  # SharedArray (m, ...) or None (symmetric)
    out: object  # SharedArray: (n*(n-1)/2,), (n, n) or (n, m)
    block: object
    condensed: bool


def strips(n: int, parts: int, symmetric: bool) -> list[tuple[int, int]]:
    """Cut rows [0, n) into at most ``parts`` runs of about equal pairs (upper triangle
    pairs when ``symmetric``: row i has n - i of them)."""
    if n == 0:
        return []
    parts = max(1, min(parts, n))
    if not symmetric:
        step = -(-n // parts)
        return [(i, min(n, i + step)) for i in range(0, n, step)]
    total = n * (n + 1) // 2
    cuts, acc, i0 = [], 0, 0
    for i in range(n):
        acc += n - i
        if acc * parts >= total * (len(cuts) + 1) and i + 1 < n:
            cuts.append((i0, i + 1))
            i0 = i + 1
    cuts.append((i0, n))
    return cuts


def condensed_start(n: int, i: int) -> int:
    """Index in the condensed vector of the pair (i, i + 1) (scipy's pdist order)."""
    return n * i - i * (i + 1) // 2


def strip_task(job: StripJob, i0: int, i1: int) -> int:
    """Compute rows [i0, i1) against their columns and write them into ``out``; pairs done.

    In a worker, the task unmaps the arrays when it is done: a worker keeps the arrays
    it attached cached, and a 1.6 GB result must not stay mapped there after the run."""
    try:
        return _strip(job, i0, i1)
    finally:
        if shoal.current_worker() is not None:
            for sa in (job.x, job.y, job.out):
                if sa is not None:
                    sa.close()


def _strip(job: StripJob, i0: int, i1: int) -> int:
    x = _read_only(job.x.array)
    if job.y is not None:
        cols, c0 = _read_only(job.y.array), 0
    else:
        cols, c0 = x[i0:], i0
    d = _block(job.block, x[i0:i1], cols, i0, i1, c0)
    return place(job.out.array, d, len(x), i0, i1, job.y is not None, job.condensed)


def rows_task(block, rows, cols, i0: int, i1: int, c0: int):
    """Across hosts: ``block(rows, cols)`` checked, returned to the driver (``place`` writes
    it there).  ``rows`` and ``cols`` came with the task (no shared memory between hosts)."""
    return _block(block, _read_only(rows), _read_only(cols), i0, i1, c0)


def _block(block, rows, cols, i0: int, i1: int, c0: int):
    from ._pair_tasks import PairError

    try:
        d = block(rows, cols)
    except Exception as exc:
        hint = ("; block gets read-only views of the shared rows (other strips read them at "
                "the same time): copy them before changing them") if _writes(exc) else ""
        raise PairError(f"block failed on rows [{i0}, {i1}) x columns [{c0}, "
                        f"{c0 + len(cols)}): {exc!r}{hint}", i0, c0) from exc
    shape = getattr(d, "shape", None)
    if shape != (i1 - i0, len(cols)):
        raise PairError(f"block(rows, cols) for rows [{i0}, {i1}) x columns [{c0}, "
                        f"{c0 + len(cols)}) returned shape {shape}, expected "
                        f"{(i1 - i0, len(cols))}", i0, c0)
    if d.dtype.kind not in "biuf":
        # a complex block would lose its imaginary part in the float64 result without a word,
        # an object one become NaN or a ValueError naming nothing (the tiled path's rule)
        raise PairError(f"block(rows, cols) for rows [{i0}, {i1}) x columns [{c0}, "
                        f"{c0 + len(cols)}) returned a {d.dtype} array; it must return a "
                        "real-valued array", i0, c0)
    return d


def place(out, d, n: int, i0: int, i1: int, rect: bool, condensed: bool) -> int:
    """Write strip ``d`` (rows [i0, i1)) into ``out``; the pairs it holds."""
    if rect:
        out[i0:i1] = d
        return d.size
    if condensed:
        for r in range(i1 - i0):
            i = i0 + r
            s = condensed_start(n, i)
            out[s:s + n - i - 1] = d[r, r + 1:]
        return (i1 - i0) * (n - i0) - (i1 - i0) * (i1 - i0 + 1) // 2
    out[i0:i1, i0:] = d  # (the diagonal block in full, as block computed it)
    out[i1:, i0:i1] = d[:, i1 - i0:].T  # the mirror below the diagonal block
    return (i1 - i0) * (n - i0) - (i1 - i0) * (i1 - i0 - 1) // 2


def _read_only(a):
    """A view of a shared input that ``block`` cannot write: the strips of every worker read
    the same rows concurrently, so a block that normalised its rows in place (``a -= ...``)
    changed other strips' inputs mid-read -- a result off by 0.14 in one run of three, right in
    the others, where the same block called once on the user's array is exact."""
    v = a.view()
    v.flags.writeable = False
    return v


def _writes(exc: BaseException) -> bool:
    return isinstance(exc, ValueError) and "read-only" in str(exc)


def run(pilot, x, y, block, condensed: bool, across: bool = False):
    """The array path of ``all_pairs.compute``: (result array view, seconds, strips, pairs)."""
    import numpy as np

    n = len(x)
    m = n if y is None else len(y)
    if across:
        return _run_across(pilot, x, y, block, condensed)
    owned = []
    try:
        xs = shoal.SharedArray(x.shape, x.dtype)
        owned.append(xs)
        xs.array[...] = x
        ys = None
        if y is not None:
            ys = shoal.SharedArray(y.shape, y.dtype)
            owned.append(ys)
            ys.array[...] = y
        shape = (n * (n - 1) // 2,) if condensed else (n, m)
        from .all_pairs import check_fits

        check_fits(shape[0] * (shape[1] if len(shape) > 1 else 1),
                   f"the condensed result of {n} items" if condensed else f"the {n} x {m} result")
        out = shoal.SharedArray(shape, "float64")
        owned.append(out)
        job = StripJob(xs, ys, out, block, condensed)
        parts = strips(n, STRIPS_PER_WORKER * max(1, pilot.workers), y is None)
        t0 = time.perf_counter()
        futs = [pilot.submit(strip_task, job, i0, i1) for i0, i1 in parts]
        pairs = 0
        try:
            for f in futs:
                pairs += f.result()
        except BaseException:
            for f in futs:
                f.cancel()
            raise
        seconds = time.perf_counter() - t0
        result = out.array if out.array.size else np.empty(shape)
        return result, seconds, len(parts), pairs
    finally:
        for sa in owned:
            sa.close()


def _run_across(pilot, x, y, block, condensed: bool):
    """``run`` when workers are on other hosts: each strip task carries its rows (and the
    columns it needs), returns its block, and the driver places it (see the module doc)."""
    import numpy as np

    from .all_pairs import check_fits

    n = len(x)
    m = n if y is None else len(y)
    shape = (n * (n - 1) // 2,) if condensed else (n, m)
    check_fits(shape[0] * (shape[1] if len(shape) > 1 else 1),
               f"the condensed result of {n} items" if condensed else f"the {n} x {m} result")
    out = np.empty(shape)
    parts = strips(n, STRIPS_PER_WORKER * max(1, pilot.workers), y is None)
    t0 = time.perf_counter()
    futs = {}
    for i0, i1 in parts:
        cols, c0 = (y, 0) if y is not None else (x[i0:], i0)
        futs[pilot.submit(rows_task, block, np.ascontiguousarray(x[i0:i1]),
                          np.ascontiguousarray(cols), i0, i1, c0)] = (i0, i1)
    pairs = 0
    try:
        for f in futs:
            i0, i1 = futs[f]
            pairs += place(out, f.result(), n, i0, i1, y is not None, condensed)
    except BaseException:
        for f in futs:
            f.cancel()
        raise
    return out, time.perf_counter() - t0, len(parts), pairs
