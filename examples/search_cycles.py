"""Simple cycles of a directed graph with shoal.patterns.backtracking (fine-grained, stealable).

    python examples/search_cycles.py [--vertices 18] [--p 0.5] [--seed 1] [--length-bound K]
                                     [--karate K] [--workers 2] [--compare]

Counts the simple cycles (optionally those of at most ``K`` vertices, networkx's
``length_bound``) in the manner of Blanusa, Ienne and Atasu, "Scalable fine-grained
parallel cycle enumeration algorithms" (SPAA 2022): a Johnson-style backtracking in
which every extension of a path by one edge is a search node, so an idle worker can
steal any open extension, however deep -- not only whole start vertices (the
coarse-grained split, which one start vertex holding most of the cycles defeats).

**A node** is a tuple of ints ``(start, v, path, length, closes, reach)``: the path
begins at ``start`` and ends at ``v``, ``path`` is its vertex set as an int bitmask,
``length`` its number of vertices, ``closes`` whether the edge ``v -> start`` exists
(the path plus that edge is a cycle), and ``reach`` the blocking information: the
vertices, off the path, from which ``start`` can still be reached without touching
the path (within the remaining length, when bounded).  The root's children are one
node per start vertex.  Each cycle is counted once, the standard way: only at its
smallest vertex, so a path from ``start`` only visits vertices greater than
``start``; a node counts (``accept``) when it ``closes``, and every node is one cycle
candidate, so ``backtracking.count(..., accept=closes)`` is the number of cycles.

**Blocking: why not Johnson's blocked set and B-lists in the node.**  Johnson's
``blocked`` set and its ``B`` lists are mutated by the search of a node's *earlier
siblings* (a vertex found unable to reach ``start`` stays blocked for the later
siblings, and an unblock cascades on the way back up), so the right blocking state of
a child depends on work done elsewhere, possibly by another worker.  The paper's
fine-grained Johnson copies that state when a task is stolen; the public skeleton
gives ``children(node)`` the node only, and nodes that carried a dict of sets would
make every child a deep copy.  What fits a stealable node is the state that depends
on the path alone: ``reach``, the set a Johnson search would leave unblocked if it
knew only the path (the vertices that can still reach ``start``), recomputed for each
child by one breadth-first search over bitmasks inside the parent's ``reach`` (it can
only shrink as the path grows).  Every child is in its parent's ``reach``, so no node
is a dead end: the search visits only paths that extend to at least one cycle, the
output-sensitive property Johnson's blocking buys (and Read and Tarjan's, whose
path-extension check this is), at the price of a search over at most the parent's
``reach`` per node instead of Johnson's amortised unblocking.  Rejected also: no
blocking at all (Tiernan's enumeration), whose dead-end paths grow exponentially on a
graph with a large part that cannot reach ``start``.

Children are built without calling anything per child: bit tricks on ints, and
the node is a plain tuple (cheap to create, to pickle and to steal).
``count_sequential`` runs the same ``children`` and ``accept`` by a plain
recursion (the reference the skeleton is measured against); ``count_johnson`` is
Johnson's algorithm with its blocked set and B-lists, sequential, for comparison.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import NamedTuple

import shoal
from shoal.patterns import backtracking


class Graph(NamedTuple):
    n: int
    succ: tuple  # succ[v]: v's successors as an int bitmask
    pred: tuple  # pred[v]: v's predecessors as an int bitmask
    bound: int  # the most vertices a counted cycle may have (n when unbounded)
    labels: tuple  # labels[i]: the caller's name of vertex i


ROOT = (-1, -1, 0, 0, False, 0)  # (start, v, path, length, closes, reach)


def from_edges(vertices, edges, length_bound: int | None = None) -> Graph:
    """A Graph of the vertices (any hashable names, in this order) and ``(u, v)`` edges.

    ``length_bound``: count only cycles of at most that many vertices (``None``: all).
    Raises ValueError naming an edge whose endpoint is not a vertex, or a bad bound.
    """
    labels = tuple(vertices)
    index = {v: i for i, v in enumerate(labels)}
    if len(index) != len(labels):
        raise ValueError("from_edges: the vertices are not distinct")
    if length_bound is not None and (isinstance(length_bound, bool)
                                     or not isinstance(length_bound, int) or length_bound < 0):
        raise ValueError(f"length_bound must be None or an int >= 0, not {length_bound!r}")
    n = len(labels)
    succ, pred = [0] * n, [0] * n
    for e in edges:
        try:
            u, v = e
            i, j = index[u], index[v]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"from_edges: edge {e!r} is not a pair of the given vertices") \
                from None
        succ[i] |= 1 << j
        pred[j] |= 1 << i
    bound = n if length_bound is None else min(length_bound, n)
    return Graph(n, tuple(succ), tuple(pred), bound, labels)


def from_networkx(g, length_bound: int | None = None) -> Graph:
    """A Graph of a networkx DiGraph (vertices in ``g``'s order)."""
    if not g.is_directed():
        raise ValueError("from_networkx: the graph is undirected (use g.to_directed(): "
                         "every edge then makes a 2-cycle)")
    return from_edges(list(g), g.edges(), length_bound)


def reach_of(g: Graph, start: int, avail: int, depth: int) -> int:
    """The vertices of ``avail`` from which ``start`` can be reached in at most ``depth``
    edges through vertices of ``avail`` only: a breadth-first search backwards from
    ``start``, one level per step, over bitmasks."""
    pred = g.pred
    frontier = pred[start] & avail
    reach = 0
    while frontier and depth > 0:
        reach |= frontier
        nxt = 0
        while frontier:
            bit = frontier & -frontier
            frontier ^= bit
            nxt |= pred[bit.bit_length() - 1]
        frontier = nxt & avail & ~reach
        depth -= 1
    return reach


def children(g: Graph, node):
    """The extensions of the path by one edge that still reach a cycle (a generator)."""
    start, v, path, length, _, reach = node
    succ, bound = g.succ, g.bound
    if start < 0:  # the root: one path per start vertex
        for s in range(g.n):
            higher = ~((2 << s) - 1)  # the vertices greater than s
            closes = bool(succ[s] >> s & 1) and bound >= 1
            r = reach_of(g, s, higher, bound - 1)
            if closes or succ[s] & r:
                yield (s, s, 1 << s, 1, closes, r)
        return
    if length >= bound:
        return
    cand = succ[v] & reach
    length += 1
    depth = bound - length  # edges a child may still walk before the edge back to start
    while cand:
        bit = cand & -cand
        cand ^= bit
        w = bit.bit_length() - 1
        # the child's reach: inside ours, off the new vertex, within the remaining length
        yield (start, w, path | bit, length, bool(succ[w] >> start & 1),
               reach_of(g, start, reach & ~bit, depth) if depth > 0 else 0)


def closes(node) -> bool:
    """accept=: the path plus the edge back to its start is a cycle."""
    return node[4]


def count_cycles(pilot, g: Graph, **options):
    """The number of simple cycles of ``g`` (of at most ``g.bound`` vertices), by
    backtracking.count: a Count (an int with ``.stats``)."""
    return backtracking.count(pilot, ROOT, functools.partial(children, g), accept=closes,
                              **options)


def count_sequential(g: Graph) -> int:
    """The same children and accept run by a plain recursion (no shoal)."""
    kids = functools.partial(children, g)

    def rec(node) -> int:
        total = 1 if node[4] else 0
        for c in kids(node):
            total += rec(c)
        return total

    return _deep(rec, ROOT, g.n)


def count_johnson(g: Graph) -> int:
    """Johnson's algorithm (1975) with its blocked set and B-lists, sequential, on
    bitmasks, over the vertices from each start up; all cycles (no length bound)."""
    if g.bound < g.n:
        raise ValueError("count_johnson counts all cycles: its blocking is unsound under a "
                         "length bound (use count_sequential)")
    return sum(_deep(functools.partial(_johnson_from, g.succ, g.n), s, g.n)
               for s in range(g.n))


def _johnson_from(succ: tuple, n: int, s: int) -> int:
    """Johnson's circuit search from ``s``: the cycles whose smallest vertex is ``s``."""
    allowed = ~((1 << s) - 1)  # s and the vertices above it
    blocked = 0
    blist = [0] * n  # blist[w]: the vertices to unblock when w is unblocked
    total = 0

    def unblock(u):
        nonlocal blocked
        todo = [u]
        while todo:
            x = todo.pop()
            if blocked >> x & 1:
                blocked &= ~(1 << x)
                b, blist[x] = blist[x], 0
                while b:
                    bit = b & -b
                    b ^= bit
                    todo.append(bit.bit_length() - 1)

    def circuit(v) -> bool:
        nonlocal blocked, total
        found = False
        blocked |= 1 << v
        nxt = succ[v] & allowed
        if nxt >> s & 1:  # the edge back to s closes a cycle
            total += 1
            found = True
        cand = nxt & ~(1 << s)
        while cand:
            bit = cand & -cand
            cand ^= bit
            if not blocked & bit and circuit(bit.bit_length() - 1):
                found = True
        if found:
            unblock(v)
        else:
            b = nxt
            while b:
                bit = b & -b
                b ^= bit
                blist[bit.bit_length() - 1] |= 1 << v
        return found

    circuit(s)
    return total


def _deep(fn, arg, n: int):
    """fn(arg) with the recursion limit raised for a path through all ``n`` vertices."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2 * n + 200))
    try:
        return fn(arg)
    finally:
        sys.setrecursionlimit(limit)


def random_digraph(n: int, p: float, seed: int, length_bound: int | None = None) -> Graph:
    """G(n, p) with directed edges (no self-loops), from ``random.Random(seed)``."""
    import random

    rng = random.Random(seed)
    edges = [(u, v) for u in range(n) for v in range(n) if u != v and rng.random() < p]
    return from_edges(range(n), edges, length_bound)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vertices", type=int, default=16)
    ap.add_argument("--p", type=float, default=0.5, help="edge probability of G(n, p)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--length-bound", type=int, default=None)
    ap.add_argument("--karate", type=int, default=None, metavar="K",
                    help="Zachary's karate club (networkx), both directions, cycles of <= K")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--compare", action="store_true",
                    help="time the sequential recursion and Johnson's algorithm too")
    args = ap.parse_args()
    if args.karate is not None:
        import networkx as nx

        g = from_networkx(nx.karate_club_graph().to_directed(), args.karate)
        what = f"karate club, cycles of <= {args.karate} vertices"
    else:
        g = random_digraph(args.vertices, args.p, args.seed, args.length_bound)
        what = f"G({args.vertices}, {args.p}) seed {args.seed}" + (
            "" if args.length_bound is None else f", cycles of <= {args.length_bound} vertices")
    if args.compare:
        for name, fn in (("sequential recursion", count_sequential), ("Johnson", count_johnson)):
            t = time.perf_counter()
            got = fn(g)
            print(f"{name}: {got:,} cycles in {time.perf_counter() - t:.2f} s")
    with shoal.Pilot(workers=args.workers) as pilot:
        count_cycles(pilot, from_edges(range(3), [(0, 1), (1, 2), (2, 0)]))  # warm up
        t = time.perf_counter()
        got = count_cycles(pilot, g, stats=True)
        dt = time.perf_counter() - t
        workers = pilot.workers
    print(f"{what}: {int(got):,} cycles; {got.stats.nodes:,} nodes, {got.stats.tasks} tasks, "
          f"{workers} worker(s), {dt:.2f} s")


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its functions by reference
    import search_cycles

    search_cycles.main()
