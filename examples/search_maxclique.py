"""Maximum clique on DIMACS graphs with shoal.patterns.branch_and_bound (MCQ-style).

    python examples/search_maxclique.py examples/data/dimacs/brock200_2.clq [--compare]

A node is (size, clique, candidates, bound): the clique so far and the vertices
that extend it, as Python int bitsets.  ``children`` colours the candidates
greedily (Tomita's MCQ): vertices of colour class k can add at most k more
vertices, so a child built from a vertex of colour k has bound size + k.
Children come highest colour first, so bounds are non-increasing and
``prune_level`` applies; each vertex leaves the candidate set of its later
siblings, so every clique is met once.  Vertices are renumbered by
non-increasing degree (bit 0 = highest degree), the initial order of MCQ.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import NamedTuple

import shoal
from shoal.patterns import branch_and_bound


class Graph(NamedTuple):
    n: int
    adj: tuple  # adj[v]: the neighbours of v as an int bitset (renumbered vertices)
    labels: tuple  # labels[v]: the vertex's number in the file (1-based)


class Node(NamedTuple):
    size: int
    clique: int  # bitset of renumbered vertices
    cand: int  # candidates: adjacent to every clique vertex
    bound: int


def read_dimacs(path) -> Graph:
    """Read a DIMACS ``.clq`` file (``p edge N M`` then ``e u v`` lines; ``c`` and ``n`` lines ignored).

    Raises ValueError naming the line for anything malformed.
    """
    n = None
    edges = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            words = line.split()
            if not words or words[0] in ("c", "n"):
                continue
            try:
                if words[0] == "p":
                    if n is not None or len(words) != 4 or words[1] not in ("edge", "col"):
                        raise ValueError("expected one 'p edge <vertices> <edges>' line")
                    n = int(words[2])
                    if n < 0 or int(words[3]) < 0:
                        raise ValueError("negative size")
                elif words[0] == "e":
                    if n is None:
                        raise ValueError("an edge before the 'p edge' line")
                    if len(words) != 3:
                        raise ValueError("expected 'e <u> <v>'")
                    u, v = int(words[1]), int(words[2])
                    if not (1 <= u <= n and 1 <= v <= n) or u == v:
                        raise ValueError(f"vertex out of range 1..{n} or a loop")
                    edges.append((u - 1, v - 1))
                else:
                    raise ValueError(f"unknown line type {words[0]!r}")
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: malformed DIMACS line {line.strip()!r}: "
                                 f"{exc}") from None
    if n is None:
        raise ValueError(f"{path}: no 'p edge <vertices> <edges>' line")
    nbr = [0] * n
    for u, v in edges:
        nbr[u] |= 1 << v
        nbr[v] |= 1 << u
    order = sorted(range(n), key=lambda v: (-nbr[v].bit_count(), v))  # high degree first
    new = {old: i for i, old in enumerate(order)}
    adj = [0] * n
    for u, v in edges:
        adj[new[u]] |= 1 << new[v]
        adj[new[v]] |= 1 << new[u]
    return Graph(n, tuple(adj), tuple(v + 1 for v in order))


def root(g: Graph) -> Node:
    return Node(0, 0, (1 << g.n) - 1, g.n)


def children(g: Graph, node: Node):
    """Greedy-colour the candidates; yield children highest colour first (bound non-increasing)."""
    adj = g.adj
    p = node.cand
    order = []  # (vertex bit, vertex, colour) in colouring order
    colour = 0
    uncoloured = p
    while uncoloured:
        colour += 1
        q = uncoloured
        while q:
            bit = q & -q
            v = bit.bit_length() - 1
            q &= ~adj[v] & ~bit
            uncoloured &= ~bit
            order.append((bit, v, colour))
    size, clique = node.size, node.clique
    for bit, v, c in reversed(order):
        yield Node(size + 1, clique | bit, p & adj[v], size + c)
        p &= ~bit


def size(node: Node) -> int:
    return node.size


def bound(node: Node) -> int:
    return node.bound


def vertices(g: Graph, node: Node) -> list[int]:
    """The clique of ``node`` as vertex numbers of the file."""
    return sorted(g.labels[v] for v in range(g.n) if node.clique >> v & 1)


def is_clique(g: Graph, node: Node) -> bool:
    vs = [v for v in range(g.n) if node.clique >> v & 1]
    return all(g.adj[u] >> v & 1 for i, u in enumerate(vs) for v in vs[i + 1:])


def max_clique(pilot, g: Graph, **options):
    """branch_and_bound.maximise over cliques of ``g``: a Result (value = clique number)."""
    options.setdefault("prune_level", True)  # children come best bound first
    return branch_and_bound.maximise(pilot, root(g), functools.partial(children, g), size, bound,
                                     **options)


def sequential_reference(g: Graph) -> int:
    """The same search hand-written (recursive, no shoal): the clique number."""
    best = 0

    def rec(node: Node) -> None:
        nonlocal best
        for c in children(g, node):
            if c.bound <= best:
                return  # children come in non-increasing bound order
            if c.size > best:
                best = c.size
            rec(c)

    rec(root(g))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--coordination", default="stack-stealing")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--compare", action="store_true", help="time sequential vs 1 and 2 workers")
    args = ap.parse_args()
    g = read_dimacs(args.path)
    if args.compare:
        t = time.perf_counter()
        ref = sequential_reference(g)
        t_seq = time.perf_counter() - t
        print(f"sequential reference: omega = {ref} in {t_seq:.2f} s")
        nodes1 = None
        for w in (1, 2):
            with shoal.Pilot(workers=w) as pilot:
                max_clique(pilot, g._replace(n=min(g.n, 20)))  # warm up: workers import numpy
                t = time.perf_counter()
                r = max_clique(pilot, g, coordination=args.coordination, stats=True,
                               reference_nodes=nodes1)
                dt = time.perf_counter() - t
            nodes1 = nodes1 or r.stats.nodes
            infl = "" if r.stats.work_inflation is None else f", work inflation {r.stats.work_inflation:.2f}"
            print(f"{w} worker(s): omega = {r.value} in {dt:.2f} s: speed-up {t_seq / dt:.2f}x, "
                  f"{r.stats.nodes} nodes{infl}")
        return
    with shoal.Pilot(workers=args.workers) as pilot:
        r = max_clique(pilot, g, coordination=args.coordination, stats=True)
    print(f"omega = {r.value}: {vertices(g, r.node)}; {r.stats.nodes} nodes, "
          f"{r.stats.pruned} pruned, {r.stats.elapsed_s:.2f} s, first incumbent at "
          f"{r.stats.first_incumbent_s:.3f} s, final at {r.stats.final_incumbent_s:.3f} s")


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its classes and functions by reference
    import search_maxclique

    search_maxclique.main()
