"""Permutation flowshop (minimise makespan) with shoal.patterns.branch_and_bound.

    python examples/search_flowshop.py [jobs] [--compare]

Instances are Taillard's (1993): processing times drawn with his published
generator (a Lehmer LCG, ``unif(seed, 1, 99)``) from the time seed of each
instance; ta001 (20 jobs x 5 machines, seed 873654221) has optimum 1278, and
its first machine row starts 54 83 15 71 77.  A node is a partial sequence with
its completion time on every machine; its lower bound is the classic one-machine
bound (for each machine: completion so far + remaining work on it + the least
tail of a remaining job after it).  Children come in non-decreasing bound order,
so ``prune_level`` applies.  The NEH heuristic gives the initial incumbent.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from typing import NamedTuple

import shoal
from shoal.patterns import branch_and_bound

TA20x5_SEEDS = (873654221, 379008056, 1866992158, 216771124, 495070989,
                402959317, 1369363414, 2021925980, 573109518, 88325120)
TA20x5_OPTIMA = (1278, 1359, 1081, 1293, 1235, 1195, 1234, 1206, 1230, 1108)


def taillard(seed: int, jobs: int, machines: int) -> tuple:
    """Processing times p[machine][job] from Taillard's generator (unif(seed, 1, 99))."""
    m, a, b, c = 2147483647, 16807, 127773, 2836
    rows = []
    for _ in range(machines):
        row = []
        for _ in range(jobs):
            k = seed // b
            seed = a * (seed % b) - k * c
            if seed < 0:
                seed += m
            row.append(1 + int(seed / m * 99))
        rows.append(tuple(row))
    return tuple(rows)


def makespan(p, order) -> int:
    c = [0] * len(p)
    for j in order:
        prev = 0
        for k, row in enumerate(p):
            prev = c[k] = max(c[k], prev) + row[j]
    return c[-1]


def neh(p) -> tuple[int, tuple]:
    """The NEH heuristic: (makespan, order)."""
    jobs = sorted(range(len(p[0])), key=lambda j: -sum(row[j] for row in p))
    seq: list = []
    for j in jobs:
        seq = min((seq[:i] + [j] + seq[i:] for i in range(len(seq) + 1)),
                  key=lambda s: makespan(p, s))
    return makespan(p, seq), tuple(seq)


class Node(NamedTuple):
    seq: tuple  # jobs scheduled so far
    done: tuple  # completion time of the sequence on each machine
    left: int  # bitset of unscheduled jobs
    lb: int  # lower bound of any completion of seq


def _lb(p, tails, done, left) -> int:
    rest = [j for j in range(len(p[0])) if left >> j & 1]
    if not rest:
        return done[-1]
    return max(done[k] + sum(p[k][j] for j in rest) + min(tails[k][j] for j in rest)
               for k in range(len(p)))


class Problem(NamedTuple):
    p: tuple
    tails: tuple  # tails[k][j]: work of job j on the machines after k


def problem(p) -> Problem:
    m, n = len(p), len(p[0])
    tails = tuple(tuple(sum(p[i][j] for i in range(k + 1, m)) for j in range(n)) for k in range(m))
    return Problem(p, tails)


def root(pr: Problem) -> Node:
    n = len(pr.p[0])
    done = (0,) * len(pr.p)
    return Node((), done, (1 << n) - 1, _lb(pr.p, pr.tails, done, (1 << n) - 1))


def children(pr: Problem, node: Node) -> list:
    p, out = pr.p, []
    left = node.left
    while left:
        bit = left & -left
        left ^= bit
        j = bit.bit_length() - 1
        done, prev = [], 0
        for k, row in enumerate(p):
            prev = max(node.done[k], prev) + row[j]
            done.append(prev)
        rest = node.left & ~bit
        out.append(Node(node.seq + (j,), tuple(done), rest, _lb(p, pr.tails, done, rest)))
    out.sort(key=lambda c: c.lb)  # non-decreasing lower bounds: prune_level holds
    return out


def objective(node: Node) -> float:
    return node.done[-1] if node.left == 0 else float("inf")


def bound(node: Node) -> int:
    return node.lb


def solve(pilot, p, **options):
    """branch_and_bound.minimise of the makespan; NEH's value is the initial incumbent + 1."""
    pr = problem(p)
    start, _ = neh(p)
    return branch_and_bound.minimise(pilot, root(pr), functools.partial(children, pr), objective,
                                     bound, initial=start + 1, **options)


def brute_force(p) -> int:
    return min(makespan(p, order) for order in itertools.permutations(range(len(p[0]))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jobs", type=int, nargs="?", default=10, help="first jobs of ta001 (20 = ta001)")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    p = tuple(row[:args.jobs] for row in taillard(TA20x5_SEEDS[0], 20, 5))
    with shoal.Pilot(workers=args.workers) as pilot:
        t = time.perf_counter()
        r = solve(pilot, p, stats=True)
        dt = time.perf_counter() - t
    ref = f" (published optimum {TA20x5_OPTIMA[0]})" if args.jobs == 20 else ""
    print(f"ta001, first {args.jobs} jobs: makespan {r.value}{ref}, order {r.node and r.node.seq}; "
          f"{r.stats.nodes} nodes, {r.stats.pruned} pruned, {dt:.2f} s")


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its classes and functions by reference
    import search_flowshop

    search_flowshop.main()
