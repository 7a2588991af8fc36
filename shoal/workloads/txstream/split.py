"""Split planning: each worker records only its own transactions, the graph is assembled in
shared memory.  The TPG scheduler's default for operation granularity.

Partition p owns blocks of 64 consecutive transactions, dealt round robin
(``area.owned``): it records them (the only place their closures exist), and runs
their operations.  Three stages per partition, the
last two behind in-task barriers (``phase[p]`` = epoch*4 + stage, written by p's owner):

0. record own transactions into columns (``txn.ArrayTxn``: flat lists, then numpy
   arrays; only fn and guard stay Python objects); publish per transaction: operation
   count, read count, "has a guard" (``txn_nops``/``txn_nreads``/``txn_guard``), one
   numpy index write each;
1. after every partition did 0: prefix sums give global operation and read offsets;
   publish own operations' keys and reads (``meta_gid``, ``op_nreads``, ``read_gid``:
   positions from ``np.repeat`` of the offsets, one index write each);
   partition 0 also publishes ``meta_start`` (what the driver reads after the batch);
2. after every partition did 1: every task derives the edges from the shared arrays with
   numpy (``prev``: temporal; the version each read sees: parametric) — identical in
   every task — and its runners run their own operations (tpgrun's ``OpStructured`` /
   ``OpFree`` and ``OpExec``, unchanged: they walk versions through other partitions'
   operations by number, never needing those closures).

A barrier never deadlocks: a task whose partitions all wait at a barrier claims an
unclaimed partition (``area.drive``), so every partition is held by a running task.
The redo phase of a lazy batch skips stages 0-1 (the metadata is in shared memory) and
re-records a partition's own transactions only in a process that lacks them.

What it buys: recording (calling the user's function, validating keys) is the largest
planning cost per event (docs/txstream.md, "Where the time goes"); replicated, every worker
pays it for the whole batch; split, each pays it for 1/workers of it.  What it costs: two barriers per batch, and operation
granularity only (a key's chain has operations of every partition) — chain granularity
uses the replicated plan (tpg.py); the adaptive policy picks it from the previous
batch's shape.
"""

from __future__ import annotations

import time

import numpy as np

from .area import BLOCK, load_events, owned
from .policy import Shape
from .tpg import sorted_search
from .txn import ArrayTxn

_OWN: dict = {}  # (run_id, batch, p) -> Recorded: this process's recordings


def _clock() -> tuple:
    return time.perf_counter(), time.thread_time()


def _since(t0: tuple) -> tuple:
    """(wall, CPU) seconds since ``_clock()`` gave ``t0``: a section's time (wall and CPU
    apart, since on a loaded machine the wall clock mostly counts waiting for a core)."""
    return time.perf_counter() - t0[0], time.thread_time() - t0[1]


def _add(times: dict, name: str, spent: tuple) -> None:
    w, c = times.get(name, (0.0, 0.0))
    times[name] = (w + spent[0], c + spent[1])


class Recorded:
    """A partition's own transactions recorded as columns (``txn.ArrayTxn``): ``txns`` (their
    numbers in the batch, ascending), per transaction ``txn_nops``/``txn_nreads``/``txn_guard``,
    per operation ``gid``/``nreads``/``fn``/``guard``, the reads' keys ``rgid``; ``bad``: the
    transactions whose declaration failed.  ``seconds``: what recording took, (wall, CPU)."""

    def __init__(self, txns: list, rec: ArrayTxn, seconds: float):
        self.txns = np.asarray(txns, np.int64)
        cols = rec.arrays()
        self.gid, self.nreads, self.rgid = cols["gid"], cols["nreads"], cols["rgid"]
        self.txn_nops, self.txn_nreads = cols["txn_nops"], cols["txn_nreads"]
        self.txn_guard = cols["txn_guard"]
        self.fn, self.guard, self.bad = rec.fn, rec.guard, rec.bad
        self.seconds = seconds

    def positions(self, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Global positions of this partition's items (operations or reads) given the batch's
        per-transaction offsets ``starts`` and this partition's per-transaction ``counts``."""
        total = int(counts.sum())
        local = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=local[1:])
        return np.repeat(starts[self.txns] - local[:-1], counts) + np.arange(total)


def own_records(job, p: int) -> Recorded:
    key = (job.run_id, job.batch, p)
    got = _OWN.get(key)
    if got is None:
        if len(_OWN) > 64:
            _OWN.clear()
        t0 = _clock()
        mine = load_events(job, p)
        txns = owned(p, job.extra["n"], job.nparts)
        rec = ArrayTxn(job.layout)
        record = rec.record
        for t, (fn, ev) in zip(txns, mine, strict=True):
            record(t, fn, ev)
        got = _OWN[key] = Recorded(txns, rec, _since(t0))
    return got


class Global:
    """The batch's graph as every task derives it from the shared arrays (stage 2)."""

    def __init__(self, job, n_txn: int):
        nops = job.view("txn_nops")[:n_txn]
        self.n_txn = n_txn
        start = np.zeros(n_txn + 1, np.int64)
        np.cumsum(nops, out=start[1:])
        n = int(start[-1])
        self.n_ops = n
        self.txn_start = start.tolist()
        gid = job.view("meta_gid")[:n].copy()
        op_txn = np.repeat(np.arange(n_txn), nops)
        self.op_txn = op_txn.tolist()
        self.op_gid = gid.tolist()
        order = np.argsort(gid, kind="stable")
        sg = gid[order]
        new = np.ones(n, bool)
        new[1:] = sg[1:] != sg[:-1]
        prev_sorted = np.empty(n, np.int64)
        if n:
            prev_sorted[0] = -1
            prev_sorted[1:] = order[:-1]
        prev_sorted[new] = -1
        prev = np.empty(n, np.int64)
        prev[order] = prev_sorted
        self.prev = prev.tolist()
        nreads = job.view("op_nreads")[:n]
        self.rstart = np.zeros(n + 1, np.int64)
        np.cumsum(nreads, out=self.rstart[1:])
        r_gid = job.view("read_gid")[:int(self.rstart[-1])].copy()
        r_op = np.repeat(np.arange(n), nreads)
        m = n + 1
        pos = sorted_search(sg * m + order, r_gid * m + r_op) - 1
        ok = (pos >= 0) & (sg[np.clip(pos, 0, None)] == r_gid)
        self.r_prev = np.where(ok, order[np.clip(pos, 0, None)], -1)
        self.r_gid = r_gid
        # the reads of operation o are read_prev/read_gid[read_start[o]:read_start[o + 1]]
        self.read_start = self.rstart.tolist()
        self.read_prev = self.r_prev.tolist()
        self.read_gid = r_gid.tolist()
        self._fn = np.full(n, None, object)
        self._guard = np.full(n, None, object)
        self.op_fn: list = []
        self.op_guard: list = []
        self.nparts = job.nparts
        # the shape, for the adaptive choice (owner of an operation: its transaction % parts)
        owner = (op_txn // BLOCK) % job.nparts
        cross = np.zeros(n, bool)
        has = prev >= 0
        cross[has] = owner[prev[has]] != owner[has]
        hr = self.r_prev >= 0
        np.logical_or.at(cross, r_op[hr], owner[self.r_prev[hr]] != owner[r_op[hr]])
        n_chains = int(new.sum())
        counts = np.diff(np.append(np.flatnonzero(new), n)) if n else np.zeros(1)
        self.shape = Shape(n_txn, n, n_chains,
                           float(job.view("txn_guard")[:n_txn].mean()) if n_txn else 0.0,
                           float(counts.max()) / max(n, 1), float(cross.mean()) if n else 0.0,
                           None)
        self._r_op, self._order, self._new = r_op, order, new
        self._lists = None

    def chain_ok(self) -> bool:
        """Would the chain graph be acyclic (the hint for the next batch)?"""
        from .tpg import _kahn

        n = self.n_ops
        if not n:
            return False
        chain_of = np.empty(n, np.int64)
        chain_of[self._order] = np.cumsum(self._new) - 1
        hr = self.r_prev >= 0
        src, dst = chain_of[self.r_prev[hr]], chain_of[self._r_op[hr]]
        keep = src != dst
        n_chains = int(self._new.sum())
        deps: list = [[] for _ in range(n_chains)]
        if keep.any():
            for d, s in np.unique(np.stack([dst[keep], src[keep]], 1), axis=0).tolist():
                deps[d].append(s)
        return _kahn(n_chains, deps) is not None

    def adopt(self, rec: Recorded) -> np.ndarray:
        """Take a partition's closures; returns its operations' numbers (timestamp order)."""
        pos = rec.positions(np.asarray(self.txn_start, np.int64), rec.txn_nops)
        fns = np.empty(len(rec.fn), object)
        fns[:] = rec.fn
        guards = np.empty(len(rec.guard), object)
        guards[:] = rec.guard
        self._fn[pos] = fns
        self._guard[pos] = guards
        self.op_fn = self._fn.tolist()
        self.op_guard = self._guard.tolist()
        return pos


class SplitRunner:
    """One partition through stages 0-2, then its operations (delegating to ``make_exec``)."""

    def __init__(self, task, p: int):
        self.task, self.p = task, p
        self.finished = False
        self.inner = None
        job = task.job
        self.base = job.epoch * 4
        self.stage = 2 if task.redo else 0

    def _barrier(self, k: int) -> bool:
        ph = self.task.job.view("phase")
        return all(ph[q] >= self.base + k for q in range(self.task.job.nparts))

    def step(self) -> bool:
        task, job, p = self.task, self.task.job, self.p
        times = task.times
        if self.stage == 0:
            rec = own_records(job, p)
            t0 = _clock()
            txns = rec.txns
            job.view("txn_nops")[txns] = rec.txn_nops
            job.view("txn_nreads")[txns] = rec.txn_nreads
            job.view("txn_guard")[txns] = rec.txn_guard
            task.bad.update(rec.bad)
            job.view("phase")[p] = self.base + 1
            self.stage = 1
            _add(times, "record", rec.seconds)
            _add(times, "publish", _since(t0))
            return True
        if self.stage == 1:
            if not self._barrier(1):
                return False
            if not task.sized():
                self.finished = True
                return True
            t0 = _clock()
            rec = own_records(job, p)
            pos = rec.positions(task.starts, rec.txn_nops)
            job.view("meta_gid")[pos] = rec.gid
            job.view("op_nreads")[pos] = rec.nreads
            job.view("read_gid")[rec.positions(task.rstarts, rec.txn_nreads)] = rec.rgid
            if p == 0:
                job.view("meta_start")[:len(task.starts)] = task.starts
            job.view("phase")[p] = self.base + 2
            self.stage = 2
            _add(times, "publish", _since(t0))
            return True
        if self.inner is None:
            if not task.redo and not self._barrier(2):
                return False
            t0 = _clock()
            g = task.graph()
            mine = g.adopt(own_records(job, p))
            self.inner = task.runner(mine[mine >= task.first_op].tolist())
            _add(times, "assemble", _since(t0))
            return True
        t0 = _clock()
        progressed = self.inner.step()
        _add(times, "run", _since(t0))
        self.finished = self.inner.finished
        return progressed
