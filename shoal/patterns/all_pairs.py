"""All-pairs skeleton: apply ``compare`` to every pair of items, tiled, cached and stolen.

``compute(pilot, items, compare)`` returns the ``n x n`` (or ``n x m`` with
``other=``) matrix of ``compare(load(items[i]), load(other[j]))``, as in
Rocket (all-pairs on heterogeneous platforms): loading an item is often far
costlier than comparing two, so the design is about reusing loaded items.

Data flow::

    driver ── PairSpec (keys, load, compare, output handles) pickled once into a
      │       SharedArray ─► Run handle (tiny: every task message carries it)
      │  probe (only with load= and no tile=): one task loads item 0 → its size
      │  tile = default_tile(n, m, workers, cache_bytes, item size)   [_tiles.py]
      ├─ in-place outputs (shared-memory matrix, .npy memmap): ONE root task for
      │  the whole matrix; it splits into Z-ordered quadrants (spawn), thieves
      │  take the oldest half = the far end of the Z curve; leaves write their
      │  tile (and its mirror) straight into the matrix     [_pair_tasks.py]
      └─ streamed outputs (on_tile callback, top_k): the matrix as blocks of at
         most STREAM_BLOCK_PAIRS pairs, in Z order, at most 2 x workers in
         flight; each block is tiled the same way and returns its tiles / its
         per-row top-k candidates; the driver hands them on and forgets them.

Across hosts (a dask pilot with a worker on another host than the driver, asked
once per call: ``across_hosts``)::

    driver ── PairSpec pickled once ─► HostRun: the bytes, a SharedArray.per_node copy
      │       (each host's own, filled by the first task that brings the bytes there)
      │       and a BestCell.for_pilot flag (abort / finished, heard on every host)
      ├─ every output is streamed: blocks of at most n*m / (4 x workers) pairs (every
      │  host gets blocks from the start); in-memory and out= results are filled by the
      │  driver from the tiles the blocks return, as on_tile would
      └─ counters: each process's own (no memory is shared with the driver), sent back
         with every task's return; the driver keeps each process's latest

Invariants: every pair ``(i, j)`` (``i <= j`` when symmetric) is in exactly one
leaf; per-worker counters and per-item load counts are written only by the
worker that owns their row, and ``.stats`` adds them up after the root task (or
the last block) finished.  They count work done: a subtree that runs again after
its worker was killed counts twice in them.  ``stats.pairs`` and ``stats.tiles``
are the result's, each once: summed along the join tree (tile_task returns
them), where a lost task's share never arrives.

Rejected alternatives: one task per pair or per row (a row task needs every
other item, so each item is loaded ~n times; see benchmarks/bench_all_pairs.py);
the driver handing out a flat list of tiles (round-robin placement scatters
neighbouring tiles, and a big tile cannot be half-stolen); returning tiles to
the driver for the default output (n^2 floats through the rings instead of
one shared-memory matrix) -- except across hosts, where no memory is shared:
there the tiles come back (n^2 floats over the network, the least any placement
of the result in the driver needs).  Rejected across hosts: one result array per
host gathered at the end (the driver cannot read a host's memory without a
backend call per host, and a crashed host's array is lost with the tiles in it,
where a returned block is re-run elsewhere by dask); the one-host path for all
dask pilots (a task on another host is refused: its SharedArray handles name the
driver's pid and fd); the across-hosts path for all dask pilots (a one-host
LocalCluster would lose writing in place for nothing).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import pickle
import time
import uuid

import shoal

from ._pair_tasks import (
    Counter,
    HostRun,
    LoadError,
    Output,
    PairError,
    PairSpec,
    Run,
    RunFlag,
    merge_counts,
    probe_task,
    tile_task,
)
from ._progress import Ticker, progress_text
from ._tiles import TileKind, blocks, default_tile, merge_topk, sizeof

__all__ = ["compute", "AllPairsResult", "AllPairsStats", "PairError", "LoadError", "default_tile"]

STREAM_BLOCK_PAIRS = 1 << 20  # pairs per streamed block: its tiles are ~8 MiB in flight
DEFAULT_CACHE_BYTES = 256 << 20


@dataclasses.dataclass
class AllPairsStats:
    """What a run did; ``result.stats``."""

    n: int
    m: int
    symmetric: bool
    pairs: int  # pairs in the result, each once (i <= j only, when symmetric)
    tile: int  # leaf tile edge used
    workers: int
    seconds: float  # wall time of the parallel part (after the probe)
    pairs_per_s: float
    loads: int  # calls of load() (0 without load=)
    loads_per_item: float  # loads / number of distinct items
    max_loads_per_item: int
    cache_hits: int
    cache_misses: int
    cache_evictions: int
    tiles: int  # leaf tiles of the result, each once
    tiles_stolen: int  # tile tasks that ran on another worker than their spawner
    tiles_stolen_warm: int  # ... where the thief already held some of their items
    tiles_stolen_local: int  # ... thief on the spawner's NUMA node
    tiles_stolen_remote: int
    per_worker: list  # one dict of the counters above per worker: the work each did (a
    #                   tile run again after a worker was lost counts in both rows)
    item_loads: object = dataclasses.field(repr=False, default=None)  # ndarray: loads of each item

    def summary(self) -> str:
        return (f"{self.pairs} pairs in {self.seconds:.3f} s ({self.pairs_per_s:,.0f}/s), tile {self.tile}, "
                f"{self.loads} loads ({self.loads_per_item:.2f}/item, max {self.max_loads_per_item}), "
                f"cache {self.cache_hits} hits/{self.cache_misses} misses, {self.tiles} tiles, "
                f"{self.tiles_stolen} stolen ({self.tiles_stolen_warm} warm)")


def _array_type():
    import numpy as np

    class AllPairsResult(np.ndarray):
        """A numpy array with ``.stats`` (AllPairsStats) and, for top_k, ``.indices``."""

        stats: AllPairsStats | None = None
        indices = None

        def __array_finalize__(self, obj):
            self.stats = getattr(obj, "stats", None)

    return AllPairsResult


try:  # numpy is optional for shoal itself; the skeleton needs it at call time only
    AllPairsResult = _array_type()
except ImportError:  # pragma: no cover
    AllPairsResult = None


def _default_cache_bytes(workers: int) -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return DEFAULT_CACHE_BYTES
    return max(1 << 20, min(DEFAULT_CACHE_BYTES, total // (4 * max(1, workers))))


def machine_memory() -> int:
    """Bytes of RAM plus swap: what the kernel's heuristic overcommit refuses to exceed in
    one allocation (numpy's ``np.empty`` of more raises MemoryError at once)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemTotal"] + info.get("SwapTotal", 0)
    except (OSError, KeyError, ValueError, IndexError):  # not Linux: page counts
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(values: int, what: str, *, path: str | None = None) -> None:
    """MemoryError (or OSError for a file) naming the size before a result is allocated.

    Shared memory and memmapped files are sparse until written: without this check a
    result larger than the machine was only found out by the workers, page by page
    (OOM kills or SIGBUS), where ``squareform(pdist(X))`` fails at once."""
    need = values * 8
    if path is None:
        have = machine_memory()
        if need > have:
            raise MemoryError(f"all_pairs: {what} needs {need / 2**30:.1f} GiB of float64, more "
                              f"than this machine's {have / 2**30:.1f} GiB of memory; use "
                              "out='d.npy' (a file), top_k=k, or condensed=True (half)")
        return
    import shutil

    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if os.path.isfile(path):  # overwritten: its blocks come back
        free += os.stat(path).st_blocks * 512
    if need > free:
        raise OSError(28, f"all_pairs: out={path!r} needs {need / 2**30:.1f} GiB, but its "
                          f"file system has {free / 2**30:.1f} GiB free")


def _check(items, other, compare, block, tile, cache_bytes, out, top_k, symmetric):
    if compare is None and block is None:
        raise TypeError("compute() needs compare=(a, b) -> float or block=(rows, cols) -> 2-D array")
    for name, fn in (("compare", compare), ("block", block)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    for name, seq in (("items", items), ("other", other)):
        if seq is not None and (isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__")):
            raise TypeError(f"{name} must be a sequence of keys or values (a list), got {type(seq).__name__}")
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
        raise ValueError(f"tile must be a positive int (the leaf tile edge), got {tile!r}")
    if cache_bytes is not None and (isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int)
                                    or cache_bytes < 1):
        raise ValueError(f"cache_bytes must be a positive int, got {cache_bytes!r}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        if out is not None:
            raise ValueError("top_k= and out= exclude each other: top_k already bounds the result")
    if out is not None and not callable(out) and not isinstance(out, (str, os.PathLike)):
        raise TypeError("out= must be a file path (a .npy memmap) or a callable on_tile(i0, j0, tile), "
                        f"got {type(out).__name__}")


def compute(pilot, items, compare=None, *, load=None, symmetric=True, other=None, tile=None,
            cache_bytes=None, block=None, out=None, top_k=None, largest=False,
            condensed=False):
    """The matrix of ``compare(load(items[i]), load(other[j]))`` over all pairs, with ``.stats``.

    * ``items``: keys (paths, ids) with ``load(key) -> value`` run on the
      workers, or the values themselves (``load=None``); must pickle.
    * ``compare(a, b) -> real number`` per pair, or ``block(rows, cols) ->
      array (len(rows), len(cols))`` on lists of loaded values (used when given).
    * ``symmetric=True``: ``compare`` is symmetric; each unordered pair (and
      ``(i, i)``) is computed once and both halves are filled.  ``other=`` makes
      the problem rectangular (``n x m``); ``symmetric`` is then ignored.
    * ``tile``: leaf tile edge (default from n, workers, cache size);
      ``cache_bytes``: each worker's item cache (default min(256 MiB, RAM/4/workers)).
    * ``out``: ``None`` -> an in-memory ``AllPairsResult``; a path -> a ``.npy``
      file written in place through numpy memmaps (for matrices larger than
      memory), returned as a read-write memmap; a callable ``on_tile(i0, j0,
      tile)`` -> called in the driver with every tile (the mirrored tiles too,
      so the calls cover the whole matrix once), the result is empty.
    * ``top_k=k``: the ``k`` best columns per row only (smallest values, or
      largest with ``largest=True``; a symmetric problem leaves out ``(i, i)``):
      values ``(n, k)`` with ``.indices`` ``(n, k)``, best first, padded with
      NaN / -1; memory O(n k) in the driver.
    * ``condensed=True`` (symmetric only): the pairs ``i < j`` as one vector in
      scipy's ``pdist`` order, ``n (n - 1) / 2`` values (``.stats`` as usual).

    Vectors already in memory: ``items`` a numpy array (one item per row), no
    ``load``, a ``block`` and an in-memory result: the rows go to the workers
    once through shared memory and are swept in strips of equal pair counts
    (``_pair_arrays``), e.g. ``compute(pilot, X, block=cdist, condensed=True)``
    equals ``scipy.spatial.distance.pdist(X)``.
    """
    import numpy as np

    _check(items, other, compare, block, tile, cache_bytes, out, top_k, symmetric)
    if condensed and (other is not None or not symmetric or out is not None
                      or top_k is not None):
        raise ValueError("condensed=True is the upper triangle of a symmetric problem kept in "
                         "memory: not with other=, symmetric=False, out= or top_k=")
    across = across_hosts(pilot)
    if (block is not None and load is None and out is None and top_k is None
            and _plain_array(items) and (other is None or _plain_array(other))):
        return _array_compute(pilot, items, other if other is not None else None, block,
                              symmetric or other is not None, bool(condensed), across)
    if condensed:
        full = compute(pilot, items, compare, load=load, symmetric=True, tile=tile,
                       cache_bytes=cache_bytes, block=block)
        flat = full[np.triu_indices(len(full), 1)].view(AllPairsResult)
        flat.stats = full.stats
        return flat
    items = list(items)
    symmetric = bool(symmetric) and other is None
    other = None if other is None else list(other)
    n = len(items)
    m = len(other) if other is not None else n
    n_items = n + (m if other is not None else 0)  # distinct items (both data sets)
    workers = max(1, pilot.workers)
    cache_bytes = cache_bytes or _default_cache_bytes(workers)
    mode = (Output.TOPK if top_k is not None else Output.ARRAY if out is None
            else Output.CALLBACK if callable(out) else Output.MEMMAP)
    if mode is Output.TOPK:  # values and indices, (n, k) each: found out after the run otherwise
        check_fits(2 * n * top_k, f"top_k={top_k} for {n} rows (values and indices)")

    if across:
        return _hosts_compute(pilot, items, other, load, compare, block, symmetric, mode, out,
                              tile, workers, cache_bytes, top_k, bool(largest))
    shared, flags = [], None
    try:
        result_sa, path = None, None
        if mode is Output.ARRAY:
            check_fits(n * m, f"the {n} x {m} result")
            result_sa = shoal.SharedArray((n, m), "float64")
            shared.append(result_sa)
        elif mode is Output.MEMMAP:
            path = os.fspath(out)
            check_fits(n * m, f"the {n} x {m} result", path=path)
            np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, m)).flush()
        rows = workers + 1  # row 0: the driver (unused), then one per worker
        counters = shoal.SharedArray((rows, len(Counter)), "int64", fill=0)
        loads = shoal.SharedArray((rows, max(1, n_items)), "int32", fill=0)
        flags = shoal.SharedArray((len(RunFlag),), "int64", fill=0)
        shared += [counters, loads, flags]
        spec = PairSpec(n=n, m=m, items=items, other=other, load=load, compare=compare, block=block,
                    symmetric=symmetric, mode=mode, result=result_sa, path=path, counters=counters,
                    loads=loads, flags=flags, cache_bytes=cache_bytes, top_k=top_k, largest=bool(largest))
        blob = _spec_bytes(spec)
        blob_sa = shoal.SharedArray((len(blob),), "uint8")  # items reach workers by memory, not rings
        shared.append(blob_sa)
        blob_sa.array[:] = np.frombuffer(blob, dtype=np.uint8)
        run = Run(uuid.uuid4().hex, pickle.dumps(blob_sa), len(blob))

        tile = _chosen_tile(pilot, run, tile, n, m, items, load, workers, cache_bytes, symmetric)
        t0 = time.perf_counter()
        total = n * (n + 1) // 2 if symmetric and other is None else n * m
        with Ticker("all_pairs", _sampler(counters, total), rates=("pairs", "tiles"),
                    text=_line) as ticker:
            topk, pairs, tiles = _run(pilot, run, mode, n, m, symmetric, tile, workers, out, top_k,
                                      largest, ticker)
        seconds = time.perf_counter() - t0
        stats = _stats(counters.array, loads.array, n, m, symmetric, tile, workers, seconds, n_items,
                       pairs, tiles)
        flags.array[RunFlag.DONE] = 1

        # no copy of an in-memory result: its pages live as long as the returned array does
        return _returned(mode, result_sa.array if mode is Output.ARRAY else None, path, topk, stats)
    except BaseException:
        if flags is not None:  # Ctrl-C or an error: tiles still queued or running return at
            flags.array[RunFlag.ABORT] = 1  # once instead of finishing the abandoned matrix
        raise
    finally:
        if flags is not None:
            flags.array[RunFlag.DONE] = 1  # workers drop this run's state when they see their next run
        for sa in shared:
            sa.close()


def _spec_bytes(spec) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(spec)
    except Exception as exc:
        raise TypeError(f"all_pairs.compute: cannot pickle items/load/compare/block for the workers: {exc!r}; "
                        "use module-level functions and picklable items") from exc


def across_hosts(pilot) -> bool:
    """Whether some of ``pilot``'s workers are on another host than this driver (asked once
    per ``compute`` call): a dask pilot whose dask workers' host names (asked through the
    dask client its shared factory relays by) are not all this host's.  Shared memory of
    the driver reaches only workers of its own host."""
    if pilot.backend is not shoal.BackendKind.DASK:
        return False
    import socket

    client = getattr(pilot.shared, "client", None)
    if client is None:  # pragma: no cover - a dask factory without a client: assume hosts
        return True
    hosts = [h for h in client.run(socket.gethostname, on_error="ignore").values()
             if isinstance(h, str)]
    here = socket.gethostname()
    return not hosts or any(h != here for h in hosts)  # none yet (batch jobs pending): the
    #                                                    path that works wherever they start


class _Live:
    """The counters the progress line samples, across hosts: the processes' latest
    snapshots, kept up to date by the driver as block results arrive."""

    def __init__(self):
        import numpy as np

        self.counts: dict = {}
        self.array = np.zeros((1, len(Counter)), np.int64)

    def add(self, snaps: dict) -> None:
        import numpy as np

        self.counts = merge_counts([self.counts, snaps])
        self.array = np.array([c[0] for c in self.counts.values()] or [np.zeros(len(Counter))],
                              dtype=np.int64)


def _hosts_compute(pilot, items, other, load, compare, block, symmetric, mode, out, tile,
                   workers, cache_bytes, top_k, largest):
    """compute() on a pilot whose workers are (partly) on other hosts: the items fill one
    copy per host (``HostRun``), tiles come back as task results and the driver writes them."""
    import numpy as np

    n = len(items)
    m = len(other) if other is not None else n
    n_items = n + (m if other is not None else 0)
    result, path, sink = None, None, out
    if mode is Output.ARRAY:
        check_fits(n * m, f"the {n} x {m} result")
        result = np.empty((n, m))
    elif mode is Output.MEMMAP:
        path = os.fspath(out)
        check_fits(n * m, f"the {n} x {m} result", path=path)
        result = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, m))
    if result is not None:
        def sink(i0, j0, t):
            result[i0:i0 + t.shape[0], j0:j0 + t.shape[1]] = t
    sent = Output.CALLBACK if result is not None else mode  # tiles come back to be written here
    spec = PairSpec(n=n, m=m, items=items, other=other, load=load, compare=compare, block=block,
                    symmetric=symmetric, mode=sent, result=None, path=None, counters=None,
                    loads=None, flags=None, cache_bytes=cache_bytes, top_k=top_k, largest=largest)
    blob = _spec_bytes(spec)
    copy = shoal.SharedArray.per_node(pilot, (len(blob) + 1,), "uint8", fill=0)
    flags = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
    try:
        run = HostRun(uuid.uuid4().hex, len(blob), copy, flags, blob)
        tile = _chosen_tile(pilot, run, tile, n, m, items, load, workers, cache_bytes, symmetric)
        t0 = time.perf_counter()
        total = n * (n + 1) // 2 if symmetric else n * m
        live = _Live()
        with Ticker("all_pairs", _sampler(live, total), rates=("pairs", "tiles"),
                    text=_line) as ticker:
            topk, pairs, tiles = _run(pilot, run, sent, n, m, symmetric, tile, workers, sink,
                                      top_k, largest, ticker, on_counts=live.add)
        seconds = time.perf_counter() - t0
        snaps = list(live.counts.values())
        ctr = np.zeros((1 + len(snaps), len(Counter)), np.int64)
        loads = np.zeros((1 + len(snaps), max(1, n_items)), np.int32)
        for row, (c, nz, vals) in enumerate(snaps, 1):
            ctr[row], loads[row, nz] = c, vals
        stats = _stats(ctr, loads, n, m, symmetric, tile, workers, seconds, n_items, pairs, tiles)
        for row, (host, _) in zip(stats.per_worker, live.counts, strict=True):
            row["host"] = host
        if mode is Output.MEMMAP:  # the driver wrote the file through its own map
            result.flush()
            del result
            result = None
        return _returned(mode, result, path, topk, stats)
    except BaseException:
        flags.offer(HostRun.ABORTED)  # tiles queued or running anywhere return at once
        raise
    finally:
        flags.offer(HostRun.FINISHED)  # the hosts' processes drop the run at their next one
        copy.close()
        flags.close()


def _chosen_tile(pilot, run, tile, n, m, items, load, workers, cache_bytes, symmetric) -> int:
    """The tile side: the caller's, else ``default_tile`` from one item's size (``load``ed on a
    worker by ``probe_task`` when the items are keys)."""
    if n and m and tile is None:
        item_bytes = pilot.submit(probe_task, run).result() if load is not None else sizeof(items[0])
        tile = default_tile(n, m, workers=workers, cache_bytes=cache_bytes, item_bytes=item_bytes,
                            symmetric=symmetric)
    return tile or 1


def _returned(mode, array, path, topk, stats):
    """What ``compute`` returns for its output ``mode``, with ``stats`` attached: the in-memory
    ``array`` as an ``AllPairsResult``, the ``out=`` file mapped again, an empty result for
    ``on_tile``, or the ``top_k`` result."""
    import numpy as np

    if mode is Output.ARRAY:
        result = array.view(AllPairsResult)
    elif mode is Output.MEMMAP:
        result = np.load(path, mmap_mode="r+")
    elif mode is Output.CALLBACK:
        result = np.empty((0, 0)).view(AllPairsResult)
    else:
        result = topk
    result.stats = stats
    return result


def _sampler(counters, total_pairs: int):
    """The progress record: the workers' own counters, summed (driver; no message)."""
    def sample() -> dict:
        t = counters.array.sum(axis=0)
        hits, misses = int(t[Counter.HITS]), int(t[Counter.MISSES])
        pairs = min(int(t[Counter.PAIRS]), total_pairs)  # work redone after a lost worker
        return {"tiles": int(t[Counter.TILES]), "pairs": pairs, "pairs_total": total_pairs,
                "percent_done": round(100.0 * pairs / total_pairs, 2) if total_pairs else 100.0,
                "cache_hits": hits, "cache_misses": misses,
                "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
                "tiles_stolen": int(t[Counter.STOLEN])}
    return sample


def _line(rec: dict) -> str:
    """The terminal line of a progress record (shoal's one progress-line format)."""
    rate, elapsed = rec.get("pairs_per_s"), rec.get("elapsed_s")
    if rate is None:  # the first sample: the average so far
        rate = rec["pairs"] / elapsed if elapsed else 0.0
    left = rec["pairs_total"] - rec["pairs"]
    eta = 0.0 if left <= 0 else (left / rate if rate else None)
    return progress_text("all_pairs", rec["pairs"], "pairs", total=rec["pairs_total"], rate=rate,
                         fields=(("tiles", rec["tiles"]), ("cache_hit_rate", rec.get("cache_hit_rate"))),
                         elapsed=elapsed, eta=eta)


def _plain_array(x) -> bool:
    """An array whose rows can go to the workers through shared memory: not object dtype
    (Python objects cannot live in a shared buffer: they take the tiled path, as a list)."""
    import numpy as np

    return isinstance(x, np.ndarray) and x.ndim >= 1 and not x.dtype.hasobject


def _array_compute(pilot, x, y, block, symmetric: bool, condensed: bool, across: bool):
    """compute() on arrays in memory (see ``_pair_arrays``)."""
    from . import _pair_arrays

    if y is None and not symmetric:
        y = x  # a full n x n sweep, both halves computed
    values, seconds, parts, pairs = _pair_arrays.run(pilot, x, y, block, condensed, across)
    result = values.view(AllPairsResult)
    n, m = len(x), len(x) if y is None else len(y)
    result.stats = AllPairsStats(
        n=n, m=m, symmetric=y is None, pairs=pairs, tile=0, workers=max(1, pilot.workers),
        seconds=seconds, pairs_per_s=pairs / seconds if seconds > 0 else 0.0, loads=0,
        loads_per_item=0.0, max_loads_per_item=0, cache_hits=0, cache_misses=0,
        cache_evictions=0, tiles=parts, tiles_stolen=0, tiles_stolen_warm=0,
        tiles_stolen_local=0, tiles_stolen_remote=0, per_worker=[])
    return result


def _run(pilot, run, mode, n, m, symmetric, tile, workers, out, top_k, largest, ticker,
         on_counts=None):
    """Run the tile tasks; returns ``(the top-k result or None, pairs, tiles)``.
    ``on_counts``: called with the processes' counters each block brings (across hosts)."""
    import numpy as np

    if n == 0 or m == 0:
        return (_topk_result(n, top_k, None) if mode is Output.TOPK else None), 0, 0
    origin = (0, -1)  # the driver: the root task is placed, not stolen
    if mode in (Output.ARRAY, Output.MEMMAP):
        root = (TileKind.TRIANGLE, 0, n, 0, n) if symmetric else (TileKind.RECT, 0, n, 0, m)
        fut = pilot.submit(tile_task, run, root, tile, origin)
        try:
            while not cf.wait([fut], timeout=ticker.timeout()).done:
                ticker.tick()
        except BaseException:  # Ctrl-C: compute() raises ABORT, so the spawned tiles stop
            fut.cancel()
            raise
        pairs, tiles, _ = fut.result()
        return None, pairs, tiles
    size = tile
    limit = STREAM_BLOCK_PAIRS
    if on_counts is not None:  # across hosts: blocks for every host from the start, not one
        limit = min(limit, max(tile * tile, n * m // (4 * workers)))  # block lent on and on
    while (2 * size) ** 2 <= limit:
        size *= 2
    todo = iter(blocks(n, m, size, symmetric))
    pending: set = set()
    found = [np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)]
    pairs = tiles = 0
    try:
        while True:
            while len(pending) < 2 * workers:
                region = next(todo, None)
                if region is None:
                    break
                pending.add(pilot.submit(tile_task, run, region, tile, origin))
            if not pending:
                break
            done, pending = cf.wait(pending, timeout=ticker.timeout(), return_when=cf.FIRST_COMPLETED)
            ticker.tick()
            for fut in done:
                block_pairs, block_tiles, part, *counts = fut.result()
                if counts and on_counts is not None:
                    on_counts(counts[0])
                pairs += block_pairs
                tiles += block_tiles
                if mode is Output.CALLBACK:
                    for i0, j0, t in part or ():  # (None: a block that stopped on an abort)
                        out(i0, j0, t)
                        if symmetric and i0 != j0:
                            out(j0, i0, t.T)
                elif part is not None:
                    found = merge_topk(*(np.concatenate([a, b]) for a, b in zip(found, part, strict=True)),
                                       top_k, largest)
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    return (_topk_result(n, top_k, found) if mode is Output.TOPK else None), pairs, tiles


def _topk_result(n, k, found):
    import numpy as np

    values = np.full((n, k), np.nan).view(AllPairsResult)
    indices = np.full((n, k), -1, dtype=np.int64)
    if found is not None and found[0].size:
        rows, cols, vals = found
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        rank = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
        values[rows, rank] = vals
        indices[rows, rank] = cols
    values.indices = indices
    return values


def _stats(ctr, loads, n, m, symmetric, tile, workers, seconds, n_items, pairs, tiles) -> AllPairsStats:
    """The run's stats: ``pairs``/``tiles`` as the join tree counted them (each once), the
    rest from the per-worker counters (work done)."""
    import numpy as np

    ctr = np.array(ctr)
    total = ctr.sum(axis=0)
    per_item = np.array(loads).sum(axis=0)[:n_items] if n_items else np.zeros(0, np.int64)
    names = {c: c.name.lower() for c in Counter}
    per_worker = [{"worker": w, **{names[c]: int(ctr[w, c]) for c in Counter}} for w in range(1, ctr.shape[0])]
    return AllPairsStats(
        n=n, m=m, symmetric=symmetric, pairs=pairs, tile=tile, workers=workers, seconds=seconds,
        pairs_per_s=pairs / seconds if seconds > 0 else 0.0,
        loads=int(per_item.sum()), loads_per_item=float(per_item.mean()) if per_item.size else 0.0,
        max_loads_per_item=int(per_item.max()) if per_item.size else 0,
        cache_hits=int(total[Counter.HITS]), cache_misses=int(total[Counter.MISSES]),
        cache_evictions=int(total[Counter.EVICTIONS]), tiles=tiles,
        tiles_stolen=int(total[Counter.STOLEN]), tiles_stolen_warm=int(total[Counter.STOLEN_WARM]),
        tiles_stolen_local=int(total[Counter.STOLEN_LOCAL]),
        tiles_stolen_remote=int(total[Counter.STOLEN_REMOTE]),
        per_worker=per_worker, item_loads=per_item,
    )
