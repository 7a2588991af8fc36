"""Minimum vertex cover with shoal.patterns.branch_and_bound, checked against brute force.

    python examples/search_vertexcover.py [vertices] [--density 0.3] [--seed S] [--compare]

A node is ``(size, cover, alive)``: the vertices put in the cover so far and the
vertices still in the graph, as Python int bitsets.  Branching picks a vertex v
of maximum degree in the remaining graph: either v joins the cover, or all its
neighbours do (then v is not needed).  The lower bound is the size so far plus a
greedy maximal matching of the remaining edges (a cover needs one vertex per
matched edge).  Children are returned sorted by non-decreasing bound, so
``prune_level`` applies.  A node with no edge left is a cover; its objective is
its size (``inf`` otherwise).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import random
import time
from typing import NamedTuple

import shoal
from shoal.patterns import branch_and_bound


class Node(NamedTuple):
    size: int
    cover: int  # bitset of cover vertices
    alive: int  # vertices not yet decided (the remaining graph)
    bound: int


def random_graph(n: int, density: float, seed: int = 1) -> tuple:
    """G(n, p) adjacency bitsets from a seeded ``random.Random``."""
    rng = random.Random(seed)
    adj = [0] * n
    for u, v in itertools.combinations(range(n), 2):
        if rng.random() < density:
            adj[u] |= 1 << v
            adj[v] |= 1 << u
    return tuple(adj)


def matching_bound(adj, alive: int) -> int:
    """Edges of a greedy maximal matching among the ``alive`` vertices."""
    m = 0
    free = alive
    while free:
        bit = free & -free
        free ^= bit
        nb = adj[bit.bit_length() - 1] & free
        if nb:
            free &= ~(nb & -nb)
            m += 1
    return m


def _node(adj, size: int, cover: int, alive: int) -> Node:
    # vertices left without an alive neighbour are decided: they stay out of the cover
    keep = 0
    a = alive
    while a:
        bit = a & -a
        a ^= bit
        if adj[bit.bit_length() - 1] & alive:
            keep |= bit
    return Node(size, cover, keep, size + matching_bound(adj, keep))


def root(adj) -> Node:
    return _node(adj, 0, 0, (1 << len(adj)) - 1)


def children(adj, node: Node) -> list:
    alive = node.alive
    if not alive:
        return []
    best, v, a = -1, -1, alive
    while a:  # a vertex of maximum remaining degree
        bit = a & -a
        a ^= bit
        u = bit.bit_length() - 1
        d = (adj[u] & alive).bit_count()
        if d > best:
            best, v = d, u
    nb = adj[v] & alive
    take_v = _node(adj, node.size + 1, node.cover | 1 << v, alive & ~(1 << v))
    take_nb = _node(adj, node.size + best, node.cover | nb, alive & ~nb & ~(1 << v))
    return sorted((take_v, take_nb), key=lambda c: c.bound)


def objective(node: Node) -> float:
    return node.size if not node.alive else math.inf


def bound(node: Node) -> int:
    return node.bound


def is_cover(adj, cover: int) -> bool:
    return all(cover >> u & 1 or not (adj[u] & ~cover) for u in range(len(adj)))


def solve(pilot, adj, **options):
    """branch_and_bound.minimise of the cover size: a Result (node.cover is the cover)."""
    options.setdefault("prune_level", True)  # children come best bound first
    return branch_and_bound.minimise(pilot, root(adj), functools.partial(children, adj),
                                     objective, bound, **options)


def brute_force(adj) -> int:
    """The minimum cover size by trying all subsets, smallest first (small graphs only)."""
    n = len(adj)
    for k in range(n + 1):
        for vs in itertools.combinations(range(n), k):
            if is_cover(adj, sum(1 << v for v in vs)):
                return k
    raise AssertionError("unreachable: all vertices form a cover")


def sequential_reference(adj) -> int:
    """The same search hand-written (recursive, no shoal): the minimum cover size."""
    best = math.inf

    def rec(node: Node) -> None:
        nonlocal best
        for c in children(adj, node):
            if c.bound >= best:
                return  # children come in non-decreasing bound order
            if not c.alive and c.size < best:
                best = c.size
            rec(c)

    r = root(adj)
    if not r.alive:
        return 0
    rec(r)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vertices", type=int, nargs="?", default=60)
    ap.add_argument("--density", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--compare", action="store_true", help="time sequential vs 1 and 2 workers")
    args = ap.parse_args()
    adj = random_graph(args.vertices, args.density, args.seed)
    if args.compare:
        t = time.perf_counter()
        ref = sequential_reference(adj)
        t_seq = time.perf_counter() - t
        print(f"sequential reference: {ref} in {t_seq:.2f} s")
        for w in (1, 2):
            with shoal.Pilot(workers=w) as pilot:
                solve(pilot, random_graph(12, 0.3))  # warm up the workers
                t = time.perf_counter()
                r = solve(pilot, adj, stats=True)
                dt = time.perf_counter() - t
            print(f"{w} worker(s): {r.value} in {dt:.2f} s: speed-up {t_seq / dt:.2f}x, "
                  f"{r.stats.nodes} nodes")
        return
    with shoal.Pilot(workers=args.workers) as pilot:
        r = solve(pilot, adj, stats=True)
    ok = r.node is not None and is_cover(adj, r.node.cover)
    print(f"G({args.vertices}, {args.density}) seed {args.seed}: minimum vertex cover {r.value} "
          f"({'a cover' if ok else 'NOT A COVER'}); {r.stats.nodes} nodes, {r.stats.pruned} pruned, "
          f"{r.stats.elapsed_s:.2f} s")


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its classes and functions by reference
    import search_vertexcover

    search_vertexcover.main()
