"""The worker side of the all-pairs skeleton: run state, item cache, tile tasks.

Data flow (one ``all_pairs.compute`` call = one *run*)::

    driver: PairSpec (items, load, compare, output handles) ─cloudpickle once─► blob
            pilot.submit(tile_task, Run(run_id, blob), root region, tile, origin)
    worker: Run unpickles ─► RunState for run_id (once per process, then looked up)
            tile_task(region): big? ─► spawn the children in reverse Z order, run the
                                       first inline, join the rest (help-first)
                                small ─► leaf: items via the process's ItemCache,
                                       compare/block, write the tile in place
                                       (SharedArray / memmap) or return it (callback,
                                       top-k partials merged on the way up)

Invariants:
* One ``ItemCache`` per worker process, shared by runs, keyed ``(run_id, side,
  index)`` so runs never mix; a run's items are dropped once the driver marks
  that run done.
* Counters live in a ``SharedArray`` with one row per worker process; only that
  worker writes its row (the single-writer rule of the rings), so there are no
  lost updates and no messages.  Loads per item likewise (one row per worker).
  They count the work each worker did, so a subtree that runs again after its
  worker was killed (a lost loan comes home and its victim re-runs it) counts
  twice there.  The run's pairs and tiles are therefore counted along the join
  tree instead: every ``tile_task`` returns ``(pairs, tiles, part)`` summed from
  its children's returns, and a lost task's return never arrives, so the root's
  (or the blocks') sum counts each leaf of the result exactly once.
* Children are spawned newest-last in *reverse* Z order, so the owner (which
  pops the newest) walks its region in Z order while a thief (which takes the
  oldest half) gets the far end of the curve: each side keeps its own rows.
* A task that finds itself stolen (``origin`` is another worker) orders its
  children by how many of their items this worker already caches: the warm
  ones run here first, the cold ones are spawned first, i.e. offered to the
  next thief.  (The runtime's thief cannot choose among a victim's tasks, so
  the locality choice is made where it can be: by the task that was stolen.)
* The first failing pair raises ``PairError``/``LoadError`` and sets the run's
  abort flag; every task checks it before work, parents cancel their children.

Across hosts (``HostRun``, chosen by the driver): the PairSpec's bytes travel with
the tasks that leave a machine -- those the driver submits (one per block) and those
the balancer lends to another host -- and fill that host's ``SharedArray.per_node``
copy once; a shoal worker's spawns carry only the handle.  The abort/finished flags
are a ``BestCell.for_pilot`` (an abort on one host reaches the others through the
driver); counters are each process's own, returned with every ``tile_task`` result
(keyed by host and pid; the latest of each process is the largest).

Rejected: shipping items with every task (a stolen task would carry the data
set; instead the PairSpec is pickled once into a SharedArray that each process
maps and unpickles once, and tasks carry only a handle to it); returning tiles to the driver in the default mode (the result matrix is
shared memory written in place); a cache per run (a worker would hold two
runs' items at once, with two budgets); across hosts, a task that fetches the
items from the driver when its host has none (a shoal task has no way to reach the
driver but its return) and one fill task per host (the pilot cannot aim a task at a
host; blocks carrying the bytes need no such aim).
"""

from __future__ import annotations

import enum
import numbers
import os

import shoal

from ._tiles import ItemCache, TileKind, merge_topk, pairs_in, sizeof, split


class Output(enum.Enum):
    ARRAY = "array"  # shared-memory result matrix
    MEMMAP = "memmap"  # .npy file opened as numpy memmap by every worker
    CALLBACK = "callback"  # tiles travel back to the driver's on_tile
    TOPK = "topk"  # per-row best k, merged on the way up


class Counter(enum.IntEnum):
    HITS = 0
    MISSES = 1
    EVICTIONS = 2
    TILES = 3
    PAIRS = 4
    STOLEN = 5  # tile tasks that ran on another worker than the one that spawned them
    STOLEN_WARM = 6  # ... and found some of their items already in the thief's cache
    STOLEN_LOCAL = 7  # ... thief on the same NUMA node as the spawner
    STOLEN_REMOTE = 8


class RunFlag(enum.IntEnum):
    ABORT = 0
    DONE = 1


class PairError(Exception):
    """``compare``/``block`` failed on (or returned a non-number for) the pair ``(i, j)``."""

    def __init__(self, message: str, i: int, j: int):
        super().__init__(message, i, j)
        self.i, self.j = i, j

    def __str__(self) -> str:
        return self.args[0]


class LoadError(Exception):
    """``load(key)`` failed for item ``index`` of a data set."""

    def __init__(self, message: str, key, index: int):
        super().__init__(message, key, index)
        self.key, self.index = key, index

    def __str__(self) -> str:
        return self.args[0]


class PairSpec:
    """What every task of a run needs; pickled once by the driver (cloudpickle)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Run:
    """A run's handle, passed to every task: pickles to ``(run_id, blob handle, length)``.

    The PairSpec's pickle lives in a ``shoal.SharedArray`` (bytes), so a task message
    carries only the handle (a few dozen bytes) however big the items are.  The
    handle is that SharedArray pickled once *by the driver*: a worker passing a
    stolen task on re-sends those bytes, never re-pickles its own attached copy
    (whose fd number is the worker's, not the creator's).
    """

    __slots__ = ("run_id", "handle", "size", "_blob")

    def __init__(self, run_id: str, handle: bytes, size: int):
        self.run_id, self.handle, self.size, self._blob = run_id, handle, size, None

    def __reduce__(self):
        return (_attach, (self.run_id, self.handle, self.size))

    def blob(self):
        """The mapped SharedArray holding the PairSpec (mapped on first use in this process)."""
        if self._blob is None:
            import pickle

            self._blob = pickle.loads(self.handle)
        return self._blob


def _attach(run_id: str, handle: bytes, size: int) -> Run:
    state = _RUNS.get(run_id)
    return state.run if state is not None else Run(run_id, handle, size)


class HostRun:
    """A run's handle when the pilot's workers are on other hosts than the driver (one
    ``HostRun`` per ``compute`` call; see "Across hosts" in the module doc).

    ``copy`` is a ``SharedArray.per_node``: each host's own array of ``size + 1`` bytes,
    the PairSpec's pickle and a last byte set once it is filled.  A HostRun that leaves a
    machine (from the driver, or lent by the balancer: ``portable_dumps``) carries the
    pickle's bytes (and so does the dask worker's hand-over to its shoal worker), and
    unpickling it fills that host's copy if it is still empty; a shoal worker's spawns
    carry only the handle.  ``flags`` is a
    ``BestCell.for_pilot``: 0 running, ``ABORTED`` (a pair failed anywhere: every host
    hears it), ``FINISHED`` (the driver is done with the run)."""

    __slots__ = ("run_id", "size", "copy", "flags", "_data")

    ABORTED = 1.0
    FINISHED = 2.0

    def __init__(self, run_id: str, size: int, copy, flags, data: bytes | None = None):
        self.run_id, self.size, self.copy, self.flags, self._data = run_id, size, copy, flags, data

    def __reduce__(self):
        # Outside a shoal worker (the driver, a dask worker handing the task to its shoal
        # workers or lending it to another host) the bytes go with it; a shoal worker's
        # spawns stay on its host, whose copy is filled: the handle is enough.
        data = self._data
        if data is None and shoal.current_worker() is None:
            data = self.spec_bytes()
        return (_attach_host, (self.run_id, self.size, data, self.copy, self.flags))

    def spec_bytes(self) -> bytes:
        """The PairSpec's pickle, from this host's copy."""
        a = self.copy.array
        if not a[self.size]:
            raise RuntimeError(f"all_pairs: run {self.run_id} reached host {_host()!r} without "
                               "its items (its copy there was never filled); report this as a bug")
        return a[:self.size].tobytes()

    def fill(self, data: bytes) -> None:
        a = self.copy.array
        if not a[self.size]:
            a[:self.size] = memoryview(data)
            a[self.size] = 1  # after the bytes


def _host() -> str:
    import socket

    return socket.gethostname()


def _attach_host(run_id: str, size: int, data, copy, flags) -> HostRun:
    st = _RUNS.get(run_id)
    if st is not None:
        return st.run
    run = HostRun(run_id, size, copy, flags)
    if data is not None:
        try:
            run.fill(data)  # the first task on this host brings the items
        except (AttributeError, OSError):  # a handle with no memory here (dask's scheduler
            run._data = data  # unpickles task arguments too): it passes the bytes on
    return run


_CACHE: ItemCache | None = None  # this process's items, all runs
_RUNS: dict = {}  # run_id -> RunState, this process


class RunState:
    """One run as seen by one worker process (owner only: the worker's thread)."""

    def __init__(self, run: Run):
        import cloudpickle
        import numpy as np

        global _CACHE
        self.hosts = isinstance(run, HostRun)
        spec = cloudpickle.loads(run.spec_bytes() if self.hosts
                                 else run.blob().array[:run.size].tobytes())
        self.run, self.spec = run, spec
        me = shoal.current_worker()
        self.worker = me.id if me is not None else 0
        self.node = me.node if me is not None else 0
        if self.hosts:  # this process's own counters, sent back with every task's return
            self.key = (_host(), os.getpid())  # (worker ids are per node: 1 on every host)
            self.ctr = np.zeros(len(Counter), np.int64)
            self.loads = np.zeros(max(1, spec.n + (spec.m if spec.other is not None else 0)),
                                  np.int32)
            self.flags = _CellFlags(run.flags)
        else:
            rows = spec.counters.array.shape[0]
            self.ctr = spec.counters.array[self.worker % rows]
            self.loads = spec.loads.array[self.worker % rows]
            self.flags = spec.flags.array
        if _CACHE is None:
            _CACHE = ItemCache(spec.cache_bytes)
        _CACHE.capacity = spec.cache_bytes
        self.cache = _CACHE
        self.side_b = 1 if spec.other is not None else 0
        self.offset = (0, spec.n)  # column of side s in the loads array
        self.target = None
        if spec.mode is Output.ARRAY:
            self.target = spec.result.array
        elif spec.mode is Output.MEMMAP:
            self.target = np.load(spec.path, mmap_mode="r+")

    # -- items ---------------------------------------------------------------------

    def item(self, side: int, index: int):
        key = (self.run.run_id, side, index)
        cache = self.cache
        entry = cache.entries.get(key)
        if entry is not None:
            cache.entries.move_to_end(key)
            self.ctr[Counter.HITS] += 1
            return entry[0]
        self.ctr[Counter.MISSES] += 1
        spec = self.spec
        raw = (spec.items if side == 0 else spec.other)[index]
        if spec.load is None:
            value = raw
        else:
            self.loads[self.offset[side] + index] += 1
            try:
                value = spec.load(raw)
            except Exception as exc:
                which = "items" if side == 0 else "other"
                raise LoadError(
                    f"load({raw!r}) failed for {which}[{index}]: {type(exc).__name__}: {exc}; "
                    "check that key (a missing file? a parse error?) or remove it", raw, index) from exc
        before = cache.evictions
        cache.put(key, value)
        self.ctr[Counter.EVICTIONS] += cache.evictions - before
        return value

    def values(self, side: int, lo: int, hi: int) -> list:
        return [self.item(side, k) for k in range(lo, hi)]

    def warmth(self, region: tuple) -> int:
        """How many of ``region``'s items this process already caches."""
        _, i0, i1, j0, j1 = region
        entries, rid = self.cache.entries, self.run.run_id
        warm = sum((rid, 0, i) in entries for i in range(i0, i1))
        if region[0] is TileKind.RECT:
            warm += sum((rid, self.side_b, j) in entries for j in range(j0, j1))
        return warm

    # -- leaves --------------------------------------------------------------------

    def leaf(self, region: tuple):
        import numpy as np

        kind, i0, i1, j0, j1 = region
        rows = self.values(0, i0, i1)
        cols = rows if kind is TileKind.TRIANGLE else self.values(self.side_b, j0, j1)
        spec = self.spec
        if spec.block is not None:
            tile = self._block(rows, cols, region)
        else:
            tile = np.empty((len(rows), len(cols)))
            tri = kind is TileKind.TRIANGLE
            compare = spec.compare
            for ii, a in enumerate(rows):
                start = ii if tri else 0
                vals, jj = [], start
                try:
                    for jj in range(start, len(cols)):  # noqa: B007 - jj names the failing pair
                        vals.append(compare(a, cols[jj]))
                except Exception as exc:
                    i, j = i0 + ii, j0 + jj
                    raise PairError(f"compare failed on pair (i, j) = ({i}, {j}): "
                                    f"{type(exc).__name__}: {exc}", i, j) from exc
                tile[ii, start:] = _numeric(vals, i0 + ii, j0 + start)
            if tri:
                lower = np.tril_indices(len(rows), -1)
                tile[lower] = tile.T[lower]
        pairs = pairs_in(region)
        self.ctr[Counter.TILES] += 1
        self.ctr[Counter.PAIRS] += pairs
        return pairs, 1, self.emit(region, tile)

    def _block(self, rows, cols, region):
        import numpy as np

        _, i0, i1, j0, j1 = region
        try:
            tile = self.spec.block(rows, cols)
        except Exception as exc:
            raise PairError(f"block failed on rows [{i0}, {i1}) x columns [{j0}, {j1}): "
                            f"{type(exc).__name__}: {exc}", i0, j0) from exc
        tile = np.asarray(tile)
        if tile.shape != (len(rows), len(cols)) or tile.dtype.kind not in "biuf":
            raise PairError(
                f"block(rows, cols) for rows [{i0}, {i1}) x columns [{j0}, {j1}) returned "
                f"{tile.dtype} array of shape {tile.shape}; it must return a real-valued array of "
                f"shape ({len(rows)}, {len(cols)})", i0, j0)
        return tile.astype(np.float64, copy=False)

    def emit(self, region: tuple, tile):
        """Deliver a finished tile: write it in place, or return it (callback, top-k)."""
        import numpy as np

        kind, i0, i1, j0, j1 = region
        mode, spec = self.spec.mode, self.spec
        mirror = spec.symmetric and kind is TileKind.RECT
        if mode is Output.ARRAY or mode is Output.MEMMAP:
            out = self.target
            out[i0:i1, j0:j1] = tile
            if mirror:
                out[j0:j1, i0:i1] = tile.T
            return None
        if mode is Output.CALLBACK:
            return [(i0, j0, tile)]
        h, w = tile.shape
        r = np.repeat(np.arange(i0, i1), w)
        c = np.tile(np.arange(j0, j1), h)
        v = tile.ravel()
        if spec.symmetric:
            if mirror:
                r, c, v = np.r_[r, c], np.r_[c, r], np.r_[v, v]
            keep = r != c  # top-k of a symmetric problem: the k best *other* items
            r, c, v = r[keep], c[keep], v[keep]
        return merge_topk(r, c, v, spec.top_k, spec.largest)

    def merge(self, parts: list):
        import numpy as np

        mode = self.spec.mode
        if mode is Output.CALLBACK:
            return [t for part in parts if part for t in part]
        if mode is Output.TOPK:
            parts = [p for p in parts if p is not None]
            if not parts:
                return None
            return merge_topk(np.concatenate([p[0] for p in parts]),
                              np.concatenate([p[1] for p in parts]),
                              np.concatenate([p[2] for p in parts]),
                              self.spec.top_k, self.spec.largest)
        return None

    def close(self) -> None:
        """The run is over: drop its items and shared mappings in this process."""
        rid = self.run.run_id
        self.cache.drop(lambda key: key[0] == rid)
        self.target = self.ctr = self.loads = self.flags = None
        if self.hosts:
            if shoal.current_worker() is not None:  # (a dask worker's copy is the backend's)
                self.run.copy.close()
                self.run.flags.close()
            return
        for shared in (self.spec.result, self.spec.counters, self.spec.loads, self.spec.flags, self.run.blob()):
            if shared is not None:
                shared.close()

    def returns(self, pairs: int, tiles: int, part):
        """What a tile task returns: across hosts also this process's counters so far."""
        if not self.hosts:
            return pairs, tiles, part
        import numpy as np

        nz = np.flatnonzero(self.loads)
        return pairs, tiles, part, {self.key: (self.ctr.copy(), nz, self.loads[nz])}


def _numeric(vals: list, i: int, j0: int):
    """``vals`` as float64, or PairError naming the first non-number (strings are not numbers)."""
    import numpy as np

    arr = np.asarray(vals)
    if arr.dtype.kind in "biuf" and arr.ndim == 1:
        return arr
    for k, v in enumerate(vals):
        ok = isinstance(v, numbers.Real) or (isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "biuf")
        if not ok:
            raise PairError(f"compare returned {v!r} ({type(v).__name__}) for pair (i, j) = ({i}, {j0 + k}); "
                            "it must return a real number (int, float, numpy scalar)", i, j0 + k)
    return arr.astype(np.float64)


def state(run: Run) -> RunState:
    """This process's state for ``run`` (made on first use; finished runs are dropped then)."""
    st = _RUNS.get(run.run_id)
    if st is None:
        for rid in [r for r, s in _RUNS.items() if s.flags[RunFlag.DONE]]:
            _RUNS.pop(rid).close()
        st = _RUNS[run.run_id] = RunState(run)
    return st


def probe_task(run: Run) -> int:
    """Load item 0 here (it stays cached) and report its size: the driver picks the tile from it."""
    st = state(run)
    return sizeof(st.item(0, 0))


NOTHING = (0, 0, None)  # what an aborted tile_task returns


class _CellFlags:
    """A HostRun's flags cell read and written as the one-host flag array is."""

    __slots__ = ("cell",)

    def __init__(self, cell):
        self.cell = cell

    def __getitem__(self, flag: RunFlag) -> bool:
        value = self.cell.value
        return value >= (HostRun.FINISHED if flag is RunFlag.DONE else HostRun.ABORTED)

    def __setitem__(self, flag: RunFlag, on) -> None:
        if on:
            self.cell.offer(HostRun.FINISHED if flag is RunFlag.DONE else HostRun.ABORTED)


def merge_counts(parts) -> dict:
    """The processes' counter snapshots of several returns, the latest of each process
    (its counters only grow during a run, so the latest is the largest)."""
    out: dict = {}
    for snaps in parts:
        for key, snap in snaps.items():
            old = out.get(key)
            if old is None or snap[0].sum() >= old[0].sum():
                out[key] = snap
    return out


def tile_task(run: Run, region: tuple, tile: int, origin: tuple):
    """Compute ``region``: split and spawn while big, compute in place when a leaf.
    Returns ``(pairs, tiles, part)``: the pairs and leaf tiles of this region's result,
    each once (see the module doc), and the tiles (callback) or top-k partial it yields."""
    st = state(run)
    if st.flags[RunFlag.ABORT]:
        return st.returns(*NOTHING)
    if origin[0] > 0 and origin[0] != st.worker:
        st.ctr[Counter.STOLEN] += 1
        st.ctr[Counter.STOLEN_LOCAL if origin[1] == st.node else Counter.STOLEN_REMOTE] += 1
        if st.warmth(region):
            st.ctr[Counter.STOLEN_WARM] += 1
        children = split(region, tile)
        if len(children) > 1:  # a thief does what it has items for first
            children.sort(key=st.warmth, reverse=True)
    else:
        children = split(region, tile)
    if not children:
        try:
            return st.returns(*st.leaf(region))
        except BaseException:
            st.flags[RunFlag.ABORT] = 1
            raise
    here = (st.worker, st.node)
    futs = [shoal.spawn(tile_task, run, c, tile, here) for c in reversed(children[1:])]
    try:
        parts = [tile_task(run, children[0], tile, here)]
        parts.extend(f.result() for f in reversed(futs))
    except BaseException:
        st.flags[RunFlag.ABORT] = 1
        for f in futs:
            f.cancel()
        raise
    done = st.returns(sum(p[0] for p in parts), sum(p[1] for p in parts),
                      st.merge([p[2] for p in parts]))
    if st.hosts:
        done = (*done[:3], merge_counts([*(p[3] for p in parts), done[3]]))
    return done
