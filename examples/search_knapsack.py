"""0/1 knapsack with shoal.patterns.branch_and_bound, checked against dynamic programming.

    python examples/search_knapsack.py [items] [--seed S] [--kind weak] [--compare]

Items are sorted by non-increasing value/weight ratio.  A node decides items
0..i-1: ``(i, value, weight, taken)`` with ``taken`` a bitset of the packed
items.  Its bound is Dantzig's: the value so far plus the greedy fractional
filling of the remaining capacity with items i.. (floored: values are ints).
Children: take item i (if it fits), then skip it.  Taking keeps Dantzig's bound,
skipping cannot raise it, so bounds are non-increasing and ``prune_level``
applies.  The bound is O(log n) per node from prefix sums and a bisection.

Instances follow Pisinger's classes (uncorrelated, weakly and strongly
correlated) from a seeded ``random.Random``; ``dp`` is the textbook O(n C)
dynamic programme.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import random
import time
from typing import NamedTuple

import shoal
from shoal.patterns import branch_and_bound


class Problem(NamedTuple):
    values: tuple  # sorted by non-increasing value/weight
    weights: tuple
    capacity: int
    cum_w: tuple  # cum_w[k]: weight of items 0..k-1
    cum_v: tuple
    order: tuple  # order[i]: the item's index in the generated instance


class Node(NamedTuple):
    i: int  # items 0..i-1 are decided
    value: int
    weight: int
    taken: int  # bitset over the sorted items
    bound: int


def generate(n: int, seed: int = 1, kind: str = "weak", r: int = 1000) -> tuple:
    """(values, weights, capacity): Pisinger's uncorrelated/weak/strong classes, capacity half the weight."""
    rng = random.Random(seed)
    weights = [rng.randint(1, r) for _ in range(n)]
    if kind == "uncorrelated":
        values = [rng.randint(1, r) for _ in range(n)]
    elif kind == "weak":
        values = [max(1, w + rng.randint(-r // 10, r // 10)) for w in weights]
    elif kind == "strong":
        values = [w + r // 10 for w in weights]
    else:
        raise ValueError(f"unknown instance kind {kind!r}: uncorrelated, weak or strong")
    return tuple(values), tuple(weights), sum(weights) // 2


def problem(values, weights, capacity: int) -> Problem:
    if len(values) != len(weights) or any(w <= 0 for w in weights) or capacity < 0:
        raise ValueError("values and weights must pair up, weights be > 0 and capacity >= 0")
    order = sorted(range(len(values)), key=lambda j: (-values[j] / weights[j], j))
    vs = tuple(values[j] for j in order)
    ws = tuple(weights[j] for j in order)
    cw, cv = [0], [0]
    for v, w in zip(vs, ws, strict=True):
        cw.append(cw[-1] + w)
        cv.append(cv[-1] + v)
    return Problem(vs, ws, capacity, tuple(cw), tuple(cv), tuple(order))


def dantzig(pr: Problem, i: int, value: int, weight: int) -> int:
    """Value so far + the fractional greedy filling of the room left with items i.. (floored)."""
    cw = pr.cum_w
    room = pr.capacity - weight
    k = bisect.bisect_right(cw, cw[i] + room, i) - 1  # items i..k-1 fit whole
    b = value + pr.cum_v[k] - pr.cum_v[i]
    if k < len(pr.values):
        b += (room - (cw[k] - cw[i])) * pr.values[k] // pr.weights[k]
    return b


def root(pr: Problem) -> Node:
    return Node(0, 0, 0, 0, dantzig(pr, 0, 0, 0))


def children(pr: Problem, node: Node) -> list:
    """Take item i (if it fits), then skip it: non-increasing Dantzig bounds."""
    i = node.i
    if i == len(pr.values):
        return []
    out = []
    w = node.weight + pr.weights[i]
    if w <= pr.capacity:
        v = node.value + pr.values[i]
        out.append(Node(i + 1, v, w, node.taken | 1 << i, dantzig(pr, i + 1, v, w)))
    out.append(Node(i + 1, node.value, node.weight, node.taken,
                    dantzig(pr, i + 1, node.value, node.weight)))
    return out


def value(node: Node) -> int:
    return node.value


def bound(node: Node) -> int:
    return node.bound


def items(pr: Problem, node: Node) -> list[int]:
    """The packed items of ``node`` as indices of the generated instance."""
    return sorted(pr.order[k] for k in range(len(pr.values)) if node.taken >> k & 1)


def solve(pilot, pr: Problem, **options):
    """branch_and_bound.maximise of the packed value: a Result."""
    options.setdefault("prune_level", True)  # children come best bound first
    return branch_and_bound.maximise(pilot, root(pr), functools.partial(children, pr), value,
                                     bound, **options)


def dp(values, weights, capacity: int) -> int:
    """The optimum by dynamic programming over capacities (O(n C))."""
    best = [0] * (capacity + 1)
    for v, w in zip(values, weights, strict=True):
        for c in range(capacity, w - 1, -1):
            if best[c - w] + v > best[c]:
                best[c] = best[c - w] + v
    return best[capacity]


def sequential_reference(pr: Problem) -> int:
    """The same search hand-written (recursive, no shoal): the optimum."""
    best = 0

    def rec(node: Node) -> None:
        nonlocal best
        for c in children(pr, node):
            if c.bound <= best:
                return  # children come in non-increasing bound order
            if c.value > best:
                best = c.value
            rec(c)

    rec(root(pr))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("items", type=int, nargs="?", default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kind", default="weak", choices=["uncorrelated", "weak", "strong"])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--compare", action="store_true", help="time sequential vs 1 and 2 workers")
    args = ap.parse_args()
    vs, ws, cap = generate(args.items, args.seed, args.kind)
    pr = problem(vs, ws, cap)
    t = time.perf_counter()
    want = dp(vs, ws, cap)
    print(f"{args.kind} instance, {args.items} items, capacity {cap}: "
          f"dynamic programming {want} in {time.perf_counter() - t:.2f} s")
    if args.compare:
        t = time.perf_counter()
        ref = sequential_reference(pr)
        t_seq = time.perf_counter() - t
        print(f"sequential reference: {ref} in {t_seq:.2f} s")
        for w in (1, 2):
            with shoal.Pilot(workers=w) as pilot:
                solve(pilot, problem(*generate(10)))  # warm up the workers
                t = time.perf_counter()
                r = solve(pilot, pr, stats=True)
                dt = time.perf_counter() - t
            print(f"{w} worker(s): {r.value} in {dt:.2f} s: speed-up {t_seq / dt:.2f}x, "
                  f"{r.stats.nodes} nodes")
        return
    with shoal.Pilot(workers=args.workers) as pilot:
        r = solve(pilot, pr, stats=True)
    print(f"branch and bound: {r.value} {'ok' if r.value == want else 'MISMATCH'}; "
          f"{len(items(pr, r.node))} items packed; {r.stats.nodes} nodes, {r.stats.pruned} pruned, "
          f"{r.stats.elapsed_s:.2f} s")


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its classes and functions by reference
    import search_knapsack

    search_knapsack.main()
