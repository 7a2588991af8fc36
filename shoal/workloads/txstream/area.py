"""The shared memory of the batches in flight, and how tasks divide the partitions.

``Area`` (driver-made, re-used across batches, grown when a batch needs more):
the pickled batch (``inbox``), one state byte and one value per operation
(``op_state``/``op_val``), one abort flag per transaction (``txn_abort``),
per-chain done flags, and the metadata the driver needs after the batch
(``meta_start``: transaction offsets, ``meta_gid``: each operation's key),
written by the task that takes partition 0.  ``lock``: per key (2pl) or per
partition (partitioned) counters.  ``ctl[0]``: a cancel flag the driver sets
when one task failed, so the others stop waiting.

Single-writer rule (as in the rings): ``op_state[o]``/``op_val[o]`` are
written only by the task running o's partition, value first, state last;
``txn_abort[t]`` may be written by several tasks but only ever from 0 to 1.
Aligned stores of one word or byte are atomic on x86-64 and aarch64, and x86's
store order makes "value, then state" a publish; on weaker machines this
relies on the GIL's barriers at every bytecode switch (see docs/txstream.md).

Partitions are *claimed*, not assigned: the driver submits one task per
worker, and each task claims partitions with ``O_CREAT|O_EXCL`` files (atomic
on POSIX) — first its own, then, whenever all it holds are blocked or done,
any unclaimed one.  So a batch finishes even if the backend runs the tasks
one after another on one worker (a task never waits for a partition that no
running task holds).  Rejected: a fixed task -> partition map (deadlocks when
two tasks share a worker: the first spins on the second, which never starts).

The claim files live in a temporary directory per run (``ClaimDir``); the driver
holds an ``flock`` on its ``.driver`` file for the run's life, so a directory
whose lock anyone can take belongs to a driver that died (SIGKILL never runs the
``rmtree``), and the next run sweeps it.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

import shoal

PENDING, DONE, FAILED, SKIPPED = 0, 1, 2, 3

_FIELDS = {  # name -> (dtype, which capacity)
    "op_state": ("int8", "ops"), "op_val": ("int64", "ops"), "meta_gid": ("int64", "ops"),
    "txn_abort": ("int8", "txns"), "meta_start": ("int64", "txns1"),
    "chain_done": ("int8", "ops"), "txn_done": ("int8", "txns"), "ctl": ("int64", "ctl"),
    "lock": ("int64", "keys"),
    # split planning (split.py): per-transaction counts, then each operation's key and reads
    "txn_nops": ("int64", "txns"), "txn_nreads": ("int64", "txns"), "txn_guard": ("int8", "txns"),
    "op_nreads": ("int64", "ops"), "read_gid": ("int64", "reads"), "phase": ("int64", "parts"),
}
_RESET = ("op_state", "txn_abort", "chain_done", "txn_done", "lock", "ctl", "phase")


def _views(buf: np.ndarray, fields: dict) -> dict:
    return {name: buf[off: off + n * np.dtype(dt).itemsize].view(dt)
            for name, (off, dt, n) in fields.items()}


class Area:
    """Shared arrays for one engine, all views of ONE SharedArray (plus the inbox); driver only.

    One memfd, not nine: every task carries two handles, and a backend that
    unpickles task arguments in the driver (dask's in-process scheduler does)
    maps two arrays per run, not nine."""

    def __init__(self, nkeys: int):
        self.cap = {"ops": 0, "txns": 0, "txns1": 0, "reads": 0, "ctl": 8, "parts": 256,
                    "keys": max(nkeys, 256)}
        self.state = None
        self.inbox = None
        self.fields: dict = {}
        self._v: dict = {}

    def ensure(self, *, ops: int = 0, txns: int = 0, nbytes: int = 0, reads: int = 0) -> None:
        want = {"ops": max(ops, 1), "txns": max(txns, 1), "txns1": max(txns, 1) + 1,
                "reads": max(reads, 4 * ops, 1)}
        grow = self.state is None
        for kind, n in want.items():
            if n > self.cap[kind]:
                self.cap[kind] = max(n, 2 * self.cap[kind])
                grow = True
        if grow:
            fields, off = {}, 0
            for name, (dt, kind) in _FIELDS.items():
                fields[name] = (off, dt, self.cap[kind])
                off += -(-self.cap[kind] * np.dtype(dt).itemsize // 8) * 8
            if self.state is not None:
                self.state.close()
            self.state = shoal.SharedArray((off,), "uint8", fill=0)
            self.fields = fields
            self._v = _views(self.state.array, fields)
        if self.inbox is None or self.inbox.shape[0] < nbytes:
            if self.inbox is not None:
                self.inbox.close()
            self.inbox = shoal.SharedArray((max(nbytes, 2 * (self.inbox.shape[0] if self.inbox else 0)),),
                                           "uint8")

    def reset(self) -> None:
        for name in _RESET:
            self._v[name][...] = 0

    def view(self, name: str) -> np.ndarray:
        return self._v[name]

    def close(self) -> None:
        self._v = {}
        for arr in (self.state, self.inbox):
            if arr is not None:
                arr.close()
        self.state = self.inbox = None


@dataclass
class Job:
    """Everything a batch task needs (small and picklable: shared arrays travel as handles)."""

    kind: str                   # "tpg", "2pl", "partitioned"
    state: object               # Area.state (SharedArray)
    fields: dict                # Area.fields: name -> (offset, dtype, count)
    inbox: object               # Area.inbox (SharedArray): the pickled batch
    flat: object                # the store's SharedArray
    layout: dict
    nparts: int
    batch: int                  # batch number (the plan cache key)
    epoch: int                  # claim namespace: one per phase
    slices: list                # (offset, size) in the inbox of each partition's pickled slice
    claim_dir: str
    run_id: str
    tpg: object = None          # a fixed policy.TPG, or None: adaptive
    expected_abort: float | None = None
    start_txn: int = 0          # lazy redo: re-run transactions >= start_txn eagerly
    stall_s: float = 120.0
    extra: dict = field(default_factory=dict)

    def view(self, name: str) -> np.ndarray:
        v = self.__dict__.get("_views")
        if v is None:
            v = self.__dict__["_views"] = _views(self.state.array, self.fields)
        return v[name]

    def __getstate__(self):
        d = dict(self.__dict__)
        d.pop("_views", None)
        return d


BLOCK = 64  # consecutive transactions per ownership block (split planning)


def owned(p: int, n: int, nparts: int) -> list:
    """The transactions partition p owns: blocks of ``BLOCK`` consecutive ones, dealt round
    robin.  Rejected: single transactions round robin (``t % W``) — a hot key's chain then
    changes worker at every operation, one cross-worker hand-off each; contiguous halves —
    the second worker would wait for the first on nearly every key."""
    step = nparts * BLOCK
    return [t for b in range(p * BLOCK, n, step) for t in range(b, min(b + BLOCK, n))]


def load_events(job: Job, p: int | None = None) -> list:
    """The batch's events as ``(fn, ev)`` pairs (``p=None``), or only partition p's slice
    (``owned`` order).

    The driver pickles the batch as ``nparts`` slices, each as two lists ``(fns, evs)``
    (``txn.dumps_events(columns=True)``), so split planning unpickles only what a partition
    records."""
    import pickle

    buf = job.inbox.array
    if p is not None:
        off, size = job.slices[p]
        fns, evs = pickle.loads(buf[off:off + size].tobytes())
        return list(zip(fns, evs, strict=True))
    parts = [pickle.loads(buf[off:off + size].tobytes()) for off, size in job.slices]
    n = sum(len(fns) for fns, _ in parts)
    events: list = [None] * n
    for q, (fns, evs) in enumerate(parts):
        for t, fn, ev in zip(owned(q, n, len(parts)), fns, evs, strict=True):
            events[t] = (fn, ev)
    return events


class Cancelled(Exception):
    """The driver cancelled the batch (another task failed)."""


class Stalled(RuntimeError):
    pass


def claim(job: Job, p: int) -> bool:
    try:
        fd = os.open(os.path.join(job.claim_dir, f"{job.epoch}.{p}"),
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def drive(job: Job, slot: int, make_runner, counters: dict | None = None) -> list:
    """Claim partitions and step their runners until none is left; returns the partitions run.

    A runner has ``step() -> bool`` (did it make progress) and ``finished``.
    """
    order = [(slot + i) % job.nparts for i in range(job.nparts)]
    tried: set = set()
    ctl = job.view("ctl")

    def take():
        for p in order:
            if p not in tried:
                tried.add(p)
                if claim(job, p):
                    return p
        return None

    mine, runners = [], []
    idle, last = 0, time.monotonic()
    while True:
        progressed = False
        for r in runners:
            if r.step():
                progressed = True
        runners = [r for r in runners if not r.finished]
        if progressed:
            idle = 0
            continue
        p = take() if len(tried) < job.nparts else None
        if p is not None:
            mine.append(p)
            runners.append(make_runner(p))
            continue
        if not runners:
            return mine
        idle += 1
        if counters is not None:
            counters["waits"] = counters.get("waits", 0) + 1
        if idle < 64:
            continue
        if idle < 256:
            os.sched_yield()
            continue
        if idle & 63 == 0:
            if ctl[0]:
                raise Cancelled("the batch was cancelled by the driver")
            now = time.monotonic()
            if idle == 256:
                last = now
            elif now - last > job.stall_s:
                raise Stalled(f"txstream: no progress for {job.stall_s:.0f} s in partitions "
                              f"{mine} (a worker holding another partition died? or an event's fn "
                              "declared other accesses in another process: it must declare the "
                              "same ones every time it is called with the same ev)")
        time.sleep(0.0002 if idle < 4096 else 0.002)


CLAIM_PREFIX = "shoal-txstream-"
_OWNER = ".driver"


class ClaimDir:
    """The run's claim directory (``path``), locked by this driver until ``close``; making
    one first removes the directories of drivers that died (their lock is free)."""

    def __init__(self, parent: str | None = None):
        parent = parent or tempfile.gettempdir()
        sweep_dead_claim_dirs(parent)
        self.path = tempfile.mkdtemp(prefix=CLAIM_PREFIX, dir=parent)
        # lock a file under another name, then rename it into place: a sweeper never sees
        # an owner file that is not locked yet
        tmp = os.path.join(self.path, _OWNER + ".new")
        self._fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.rename(tmp, os.path.join(self.path, _OWNER))

    def close(self) -> None:
        if self._fd >= 0:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._fd)
            self._fd = -1


def sweep_dead_claim_dirs(parent: str) -> int:
    """Remove claim directories whose driver died (their owner lock is free); how many."""
    removed = 0
    for path in glob.glob(os.path.join(parent, CLAIM_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(path, _OWNER), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # being made, or not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live driver holds it
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    return removed
