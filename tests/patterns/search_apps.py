"""Applications for the search-skeleton tests: the examples (imported from examples/),
N-Queens and UTS adapters, and deliberately broken children functions."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "examples") not in sys.path:  # before any pilot starts: workers inherit sys.path
    sys.path.append(str(ROOT / "examples"))  # (last: examples/dask_cluster.py must not shadow tests/)

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


# -- YewPar-style random graphs, children NOT in bound order ------------------------------


def random_graph(n: int, p: float, seed: int) -> tuple:
    """G(n, p) as a tuple of adjacency bitsets (YewPar's generator draws edges the same way)."""
    import random

    rng = random.Random(seed)
    adj = [0] * n
    for u in range(n):
        for v in range(u + 1, n):
            if rng.random() < p:
                adj[u] |= 1 << v
                adj[v] |= 1 << u
    return tuple(adj)


def clique_root(adj) -> tuple:
    return (0, 0, (1 << len(adj)) - 1)  # (size, clique bitset, candidates)


def clique_children_unordered(adj, node):
    """Extend the clique by each candidate in a scrambled vertex order (not best bound
    first), each vertex leaving the candidates of its later siblings."""
    size, clique, cand = node
    order = [v for v in range(len(adj)) if cand >> v & 1]
    order.sort(key=lambda v: (v * 7919) % 13)  # deterministic, unrelated to the bound
    for v in order:
        yield (size + 1, clique | 1 << v, cand & adj[v])
        cand &= ~(1 << v)


def clique_size(node) -> int:
    return node[0]


def clique_bound(node) -> int:
    return node[0] + node[2].bit_count()


def brute_force_clique(adj) -> int:
    """The clique number by enumerating every clique (each once, in increasing vertex
    order): no bound, no ordering, nothing shared with the skeleton."""
    best = 0
    stack = [(0, (1 << len(adj)) - 1)]
    while stack:
        size, cand = stack.pop()
        best = max(best, size)
        while cand:
            bit = cand & -cand
            v = bit.bit_length() - 1
            cand &= ~bit
            stack.append((size + 1, cand & adj[v]))  # later vertices only
    return best


def rising_children(node):
    """Children with strictly *increasing* bounds (worst first), depth 3, branching 3."""
    return [node + (i,) for i in range(3)] if len(node) < 3 else []


def rising_objective(node) -> int:
    return sum(node)


def rising_bound(node) -> int:
    return sum(node) + 2 * (3 - len(node))


def gen_boom_at_12(node):
    """A generator that raises while listing the children of (1, 2), after its first child."""
    if len(node) >= 4:
        return
    for i in range(3):
        if node == (1, 2) and i == 1:
            raise ValueError("gen boom")
        yield node + (i,)


def queens_kernel(n: int, node) -> int:
    """The solutions under ``node``: a plain recursion (the kernel= of the tests)."""
    total = 1 if node[0] == n else 0
    for c in search_nqueens.children(n, node):
        total += queens_kernel(n, c)
    return total


def kernel_boom(node):
    raise RuntimeError("kernel boom")


def kernel_str(node):
    return "many"
