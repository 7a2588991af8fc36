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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

import shoal

PENDING, DONE, FAILED, SKIPPED = 0, 1, 2, 3

_FIELDS = {  # name -> (dtype, which capacity)
    "op_state": ("int8", "ops"), "op_val": ("int64", "ops"), "meta_gid": ("int64", "ops"),
    "txn_abort": ("int8", "txns"), "meta_start": ("int64", "txns1"),
    "chain_done": ("int8", "ops"), "txn_done": ("int8", "txns"),
}


class Area:
    """Shared arrays for one engine; ``ensure`` grows them (driver only)."""

    def __init__(self, nkeys: int):
        self.arrays: dict = {}
        self.cap = {"ops": 0, "txns": 0, "txns1": 0, "bytes": 0}
        self.ctl = shoal.SharedArray((8,), "int64", fill=0)
        self.lock = shoal.SharedArray((max(nkeys, 256),), "int64", fill=0)

    def ensure(self, *, ops: int = 0, txns: int = 0, nbytes: int = 0) -> None:
        want = {"ops": max(ops, 1), "txns": max(txns, 1), "txns1": max(txns, 1) + 1,
                "bytes": max(nbytes, 1)}
        for kind in want:
            if want[kind] > self.cap[kind]:
                self.cap[kind] = max(want[kind], 2 * self.cap[kind])
        for name, (dtype, kind) in _FIELDS.items():
            old = self.arrays.get(name)
            if old is None or old.shape[0] < self.cap[kind]:
                if old is not None:
                    old.close()
                self.arrays[name] = shoal.SharedArray((self.cap[kind],), dtype, fill=0)
        old = self.arrays.get("inbox")
        if old is None or old.shape[0] < self.cap["bytes"]:
            if old is not None:
                old.close()
            self.arrays["inbox"] = shoal.SharedArray((self.cap["bytes"],), "uint8", fill=0)

    def reset(self) -> None:
        for name in ("op_state", "txn_abort", "chain_done", "txn_done"):
            self.arrays[name].array[...] = 0
        self.lock.array[...] = 0
        self.ctl.array[0] = 0

    def view(self, name: str) -> np.ndarray:
        return self.arrays[name].array

    def close(self) -> None:
        for arr in self.arrays.values():
            arr.close()
        self.arrays.clear()
        self.ctl.close()
        self.lock.close()


@dataclass
class Job:
    """Everything a batch task needs (small and picklable: shared arrays travel as handles)."""

    kind: str                   # "tpg", "2pl", "partitioned"
    arrays: dict
    ctl: object
    lock: object
    flat: object                # the store's SharedArray
    layout: dict
    nparts: int
    batch: int                  # batch number (the plan cache key)
    epoch: int                  # claim namespace: one per phase
    nbytes: int
    claim_dir: str
    run_id: str
    tpg: object = None          # a fixed policy.TPG, or None: adaptive
    expected_abort: float | None = None
    start_txn: int = 0          # lazy redo: re-run transactions >= start_txn eagerly
    stall_s: float = 120.0
    extra: dict = field(default_factory=dict)


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


def drive(job: Job, slot: int, make_runner) -> list:
    """Claim partitions and step their runners until none is left; returns the partitions run.

    A runner has ``step() -> bool`` (did it make progress) and ``finished``.
    """
    order = [(slot + i) % job.nparts for i in range(job.nparts)]
    tried: set = set()
    ctl = job.ctl.array

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
                              f"{mine} (a worker holding another partition died?)")
        time.sleep(0.0002 if idle < 4096 else 0.002)
