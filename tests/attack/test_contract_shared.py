"""Attacks on SharedArrays (runtime/shared.py): a worker's cache of attached copies is
bounded (64), but letting go of a copy must not close it under a task that still uses
it; an array that cannot fit in memory is refused when it is made, not found out by
whichever process writes its pages.  Real worker processes and shared memory."""

from __future__ import annotations

import os

import pytest

import shoal
from shoal.runtime.shared import check_fits, memory_for_shared


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


def fill_and_sum(a) -> int:
    a.array[...] = 1
    return int(a.array.sum())


@pytest.mark.parametrize("shape, dtype", [((10**6, 10**6), "float64"),  # 8 TB
                                          ((2**40, 2**40), "int8")])  # 2^80 bytes: wraps int64
def test_an_array_that_cannot_fit_is_refused_when_made(shape, dtype):
    """Before: an 8 TB SharedArray on a 24 GiB machine was made without a word (a memfd
    is sparse) and the failure came later, in whichever process wrote its pages (an OOM
    kill); a shape whose size overflowed int64 wrapped to 0 and failed with "cannot reshape
array of size 0", its memfd left open.  Now a MemoryError at
    once, in numpy's words, naming the shape, the dtype, the bytes, what is available and
    what to do; nothing is left open."""
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(MemoryError) as err:
        shoal.SharedArray(shape, dtype)
    msg = str(err.value)
    assert f"shape {shape}" in msg and f"data type {dtype}" in msg
    assert f"{(shape[0] * shape[1] * (8 if dtype == 'float64' else 1)):,} bytes" in msg
    assert "available now" in msg and "numpy.memmap" in msg
    assert len(os.listdir("/proc/self/fd")) == fds


def test_per_node_arrays_are_refused_the_same_way():
    with shoal.Pilot(1) as pilot:
        with pytest.raises(MemoryError, match=r"shape \(1000000, 1000000\)"):
            shoal.SharedArray.per_node(pilot, (10**6, 10**6), "float64")


def test_an_array_that_fits_is_still_made_and_written_by_a_worker():
    """Above the size the check starts at (16 MiB): 64 MiB, every page written by a task."""
    a = shoal.SharedArray((8 << 20,), "float64", fill=0)
    try:
        with shoal.Pilot(1) as pilot:
            assert pilot.submit(fill_and_sum, a).result(60) == 8 << 20
        assert a.array.sum() == 8 << 20
    finally:
        a.close()


def test_the_refusal_rule():
    """The pure rule: more than what is available now, or than the memory cgroup's limit."""
    gib = 1 << 30
    check_fits((1,), "float64", 10 * gib, 12 * gib, None)
    check_fits((1,), "float64", 10 * gib, 12 * gib, 11 * gib)
    with pytest.raises(MemoryError, match="13.00 GiB .* 12.00 GiB available now"):
        check_fits((1,), "float64", 13 * gib, 12 * gib, None)
    with pytest.raises(MemoryError, match="cgroup's limit is 8.00 GiB"):
        check_fits((1,), "float64", 10 * gib, 12 * gib, 8 * gib)
    available, limit = memory_for_shared()  # this machine's numbers are sane
    assert 0 < available < 1 << 50 and (limit is None or limit > 0)
