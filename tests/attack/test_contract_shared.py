"""Attacks on a worker's attached copies of SharedArrays (runtime/shared.py): the cache of
mappings per process is bounded (64), but letting go of a copy must not close it under
a task that still uses it.  Real worker processes and shared memory."""

from __future__ import annotations

import os

import shoal


def total(arrays) -> int:
    return int(sum(a.array.sum() for a in arrays))


def open_fds(_a) -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_task_given_more_arrays_than_the_cache_holds():
    """Before: the 65th attached array closed the first while the task's arguments were
    unpickled, and the task failed (``'NoneType' object has no attribute 'sum'``)."""
    arrays = [shoal.SharedArray((4,), "int64", fill=i) for i in range(100)]
    try:
        with shoal.Pilot(1) as pilot:
            assert pilot.submit(total, arrays).result(60) == 4 * sum(range(100))
    finally:
        for a in arrays:
            a.close()


def test_copies_the_cache_let_go_do_not_leak_descriptors():
    """200 tasks, each given another array: the worker's open descriptors stay bounded
    (a copy nobody holds any more is released when it is garbage).  Each mapped copy
    holds two descriptors: its own and the one ``mmap`` dups.  (A guard of the fix: it
    passes before it too, where the cache closed what it let go of.)"""
    arrays = [shoal.SharedArray((4,), "int64", fill=0) for _ in range(200)]
    try:
        with shoal.Pilot(1) as pilot:
            first = pilot.submit(open_fds, arrays[0]).result(60)
            counts = [pilot.submit(open_fds, a).result(60) for a in arrays[1:]]
            assert max(counts) <= first + 2 * 64 + 8, (first, max(counts))
    finally:
        for a in arrays:
            a.close()
