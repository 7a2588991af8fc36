"""The hot loops never call across a frame-stack chunk boundary (room.py).

CPython 3.11 and 3.12 (gh-142183; fixed later by caching a chunk) ``mmap`` a fresh
chunk for a call that crosses the end of the thread's current 16 KiB chunk and
``munmap`` it on return, so a search whose recursion oscillates across that
boundary pays two system calls and a page fault per call (2-10x slower, depending only on how deep the search
was started).  Minor page faults are the deterministic witness: each fresh
chunk is zero-filled on first touch.  The searches run at every stack depth
over a chunk's worth of padding frames.
"""

from __future__ import annotations

import resource
import sys

import numpy as np
import pytest

from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import loops as L
from shoal.patterns.search import model as M
from shoal.patterns.search.room import in_room

DEPTH = 12  # a complete binary tree: 2^13 - 1 nodes


def kids(node):
    return [node * 2 + 1, node * 2 + 2] if node < 2 ** DEPTH - 1 else []


def gkids(node):
    if node < 2 ** DEPTH - 1:
        yield node * 2 + 1
        yield node * 2 + 2


class _Cell:
    value = -np.inf

    def offer(self, v):
        pass


CASES = {  # every loop the engine picks for these goals: recursive count, recursive B&B
    "count": dict(children=gkids, goal=M.Goal.COUNT),
    "bnb": dict(children=kids, goal=M.Goal.OPTIMISE, objective=lambda n: 0,
                bound=lambda n: 1, cell=_Cell()),
}


def _search(case) -> int:
    spec = M.SearchSpec(root=0, control=None, coordination=M.Coordination.SEQUENTIAL,
                        **CASES[case])
    ex = E.Explorer(spec, (), np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
    ex.dfs(0)
    return ex.tally.nodes


def _padded(k, fn):  # k frames more on the stack, then fn()
    return _padded(k - 1, fn) if k else fn()


def _worst_faults(case) -> int:
    """The most minor page faults one search took, over a chunk's worth of stack depths."""
    worst = 0
    for k in range(0, 240, 3):  # ~12 words a padding frame: 2 chunks' worth, the
        #                           deep end of the tree's band crosses a boundary in 1-2 steps
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        assert _padded(k, lambda: _search(case)) == 2 ** (DEPTH + 1) - 1
        worst = max(worst, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return worst


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_chunk_thrash_at_any_stack_depth(case, monkeypatch):
    _search(case)  # warm up: the allocator's arenas for the tree's nodes
    assert _worst_faults(case) < 200  # measured <= 7; a thrash faults once per crossing call
    if sys.implementation.name == "cpython" and (3, 11) <= sys.version_info < (3, 13):
        # the witness works: without the room, some depth thrashes (this failed before)
        monkeypatch.setattr(L, "in_room", lambda fn, *args: fn(*args))
        assert _worst_faults(case) > 1_000  # measured 2,000-4,000


def test_in_room_calls_through_and_nests():
    assert in_room(divmod, 7, 2) == (3, 1)
    assert in_room(in_room, in_room, sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        in_room(divmod, 1, 0)
