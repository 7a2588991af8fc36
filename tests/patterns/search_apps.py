"""Applications for the search-skeleton tests: the examples (imported from examples/),
N-Queens and UTS adapters, and deliberately broken children functions."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # before any pilot starts: workers inherit sys.path

import search_flowshop  # noqa: E402, F401  (used by test_search_bnb)
import search_maxclique  # noqa: E402
import search_nqueens  # noqa: E402

DIMACS = ROOT / "examples" / "data" / "dimacs"
COORDINATIONS = ["sequential", "depth-bounded", "budget", "stack-stealing", "indexed"]


def dimacs(name: str):
    return search_maxclique.read_dimacs(DIMACS / f"{name}.clq")  # shipped in examples/data


def uts_children(params, node):
    from shoal.workloads import uts

    return uts.children(params, node)


# -- broken inputs --------------------------------------------------------------------


def boom_at_depth2(node):
    if len(node) == 2:
        raise RuntimeError("boom")
    return [node + (i,) for i in range(3)] if len(node) < 4 else []


def not_iterable_at_12(node):
    if node == (1, 2):
        return 42
    return [node + (i,) for i in range(3)] if len(node) < 4 else []


def unpicklable_kids(node):
    """Depth 3 holds locks (not even cloudpickle takes them): 1 + 3 + 9 + 27 nodes."""
    import threading

    if len(node) >= 3:
        return []
    return [node + (i,) for i in range(3)] if len(node) < 2 else [node + (threading.Lock(),)
                                                                  for _ in range(3)]


def tree3(node):
    """A complete ternary tree of depth 4 over tuples (121 nodes)."""
    return [node + (i,) for i in range(3)] if len(node) < 4 else []


def str_bound(node):
    return "ten"


def depth_objective(node):
    return len(node)


def depth_bound(node):
    return 4


def is_leaf(node):
    return len(node) == 4


def slow_children(node):
    time.sleep(0.001)
    return [node + (i,) for i in range(4)] if len(node) < 12 else []


queens_children = search_nqueens.children
queens = search_nqueens.count_queens
partial = functools.partial


def no_objective(node):
    return None


def loose_bound(node):
    """Never prunes (the objective of tree3 is at most 4): every node gets visited."""
    return 10
