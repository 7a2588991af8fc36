"""One frame-stack room for every layer (shoal/_room.py): the search loops and the worker's
task loop use the same ``in_room``, and a task a real worker runs never calls across a
frame-stack chunk boundary at any stack depth.

Minor page faults are the deterministic witness (as in tests/patterns/test_search_room.py):
on CPython 3.11/3.12 a recursion oscillating across a chunk's end ``mmap``s a fresh,
zero-filled chunk per crossing call (gh-142183).
"""

from __future__ import annotations

import functools
import os
import pickle
import resource
import sys

import pytest

import shoal
import shoal._room
from shoal.patterns.search import room
from shoal.runtime import worker

DEPTH = 12  # a complete binary recursion: 2^13 - 1 calls


def _tree(d):
    return 1 if d == 0 else _tree(d - 1) + _tree(d - 1)


def _padded(k, fn):  # k frames more on the stack, then fn()
    return _padded(k - 1, fn) if k else fn()


def worst_faults(run=lambda fn: fn()) -> int:
    """The most minor page faults one recursion took, over two chunks' worth of stack depths
    (a task: it runs on a worker)."""
    _tree(DEPTH)  # warm up
    worst = 0
    for k in range(240):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        assert run(functools.partial(_padded, k, functools.partial(_tree, DEPTH))) == 2 ** DEPTH
        worst = max(worst, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return worst


def test_one_implementation():
    assert room.in_room is shoal._room.in_room
    assert worker.in_room is shoal._room.in_room
    assert pickle.loads(pickle.dumps(room.in_room)) is shoal._room.in_room  # by reference


THRASHES = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info < (3, 13)


@pytest.mark.skipif(not THRASHES, reason="only CPython 3.11/3.12 free a frame chunk per return")
def test_the_witness_sees_a_thrash_outside_the_room():
    # in the driver, without a room, some padding depth puts the boundary in the recursion
    assert worst_faults() > 1_000  # measured 4,096 (one per leaf call) ...
    assert worst_faults(shoal._room.in_room) < 200  # ... and <= 10 inside one


def test_a_worker_runs_its_tasks_in_the_room():
    with shoal.Pilot(1) as pilot:
        assert pilot.submit(worst_faults).result(timeout=60) < 200  # 4,096 without (this failed)


def _other_pythons() -> list[str]:
    """Other CPython 3.10+ interpreters on this machine (PATH, and pyenv's versions)."""
    import glob
    import shutil
    import subprocess

    found = {shutil.which(f"python3.{minor}") for minor in range(10, 15)}
    found |= set(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1*/bin/python3")))
    usable = []
    for exe in sorted(p for p in found if p):
        try:
            ok = subprocess.run([exe, "-c", "import sys; assert sys.version_info >= (3, 10)"],
                                capture_output=True, timeout=30).returncode == 0
        except OSError:
            ok = False
        if ok:
            usable.append(exe)
    return usable


def test_the_leaf_works_on_every_supported_python():
    """shoal/_room.py is stdlib only, and the worker imports it, so it must load on every
    Python shoal supports (>= 3.10).  Before: 3.10's ``code.replace`` has no
    ``co_qualname`` and the import raised TypeError (a worker could not start there)."""
    import subprocess

    pythons = _other_pythons()  # found here, not at collection: it runs each of them
    if not pythons:
        pytest.skip("no other Python 3.10+ interpreter here (PATH or ~/.pyenv/versions)")
    path = os.path.join(os.path.dirname(shoal.__file__), "_room.py")
    code = ("import runpy, sys; m = runpy.run_path(sys.argv[1]); "
            "assert m['in_room'](divmod, 7, 2) == (3, 1); print(sys.version_info[:2])")
    for exe in pythons:
        out = subprocess.run([exe, "-c", code, path], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{exe}: {out.stderr}"
