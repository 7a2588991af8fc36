"""N-Queens with shoal.patterns.backtracking: count solutions, checked against OEIS A000170.

    python examples/search_nqueens.py [n] [--coordination stack-stealing] [--kernel-depth 3]
                                      [--compare]

A node is a partial board: (row, cols, ld, rd) bitmasks, one queen per row so far;
``children`` yields one child per safe square of the next row.  Leaves at row n
are solutions.  ``--compare`` times a sequential recursive reference (same
children function, no shoal) against 1 and 2 workers and prints the ratios.
"""

from __future__ import annotations

import argparse
import functools
import time

import shoal
from shoal.patterns import backtracking
from shoal.workloads.nqueens import OEIS_A000170


def children(n: int, node):
    """Safe placements in the next row: a generator of (row, cols, ld, rd)."""
    row, cols, ld, rd = node
    if row == n:
        return
    full = (1 << n) - 1
    avail = full & ~(cols | ld | rd)
    while avail:
        bit = avail & -avail
        avail ^= bit
        yield (row + 1, cols | bit, ((ld | bit) << 1) & full, (rd | bit) >> 1)


def is_solution(n: int, node) -> bool:
    return node[0] == n


ROOT = (0, 0, 0, 0)


def count_queens(pilot, n: int, *, kernel_depth: int | None = None, **options) -> int:
    """Solutions of the n-queens problem, by backtracking.count.

    ``kernel_depth=d``: below depth ``d`` the plain recursion ``count_from`` counts
    whole subtrees (``kernel=``); the skeleton splits the rows above it.
    """
    if kernel_depth is not None:
        options.update(kernel=functools.partial(count_from, n), kernel_depth=kernel_depth)
    return backtracking.count(pilot, ROOT, functools.partial(children, n),
                              accept=functools.partial(is_solution, n), **options)


def count_from(n: int, node) -> int:
    """The solutions under ``node``: the hand-written recursion (no skeleton)."""
    total = 1 if node[0] == n else 0
    for c in children(n, node):
        total += count_from(n, c)
    return total


def sequential_reference(n: int) -> int:
    """The hand-written recursive search with the same children(): no skeleton."""
    kids = functools.partial(children, n)

    def rec(node) -> int:
        total = 1 if node[0] == n else 0
        for c in kids(node):
            total += rec(c)
        return total

    return rec(ROOT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=10)
    ap.add_argument("--coordination", default="stack-stealing")
    ap.add_argument("--kernel-depth", type=int, default=None,
                    help="count subtrees below this depth with the plain recursion (kernel=)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--compare", action="store_true", help="time sequential vs 1 and 2 workers")
    args = ap.parse_args()
    if args.compare:
        t = time.perf_counter()
        ref = sequential_reference(args.n)
        t_seq = time.perf_counter() - t
        print(f"sequential reference: {ref} in {t_seq:.2f} s")
        for w in (1, 2):
            with shoal.Pilot(workers=w) as pilot:
                count_queens(pilot, 6)  # warm up the workers
                t = time.perf_counter()
                got = count_queens(pilot, args.n, coordination=args.coordination,
                                   kernel_depth=args.kernel_depth)
                dt = time.perf_counter() - t
            print(f"{w} worker(s): {got} in {dt:.2f} s: speed-up {t_seq / dt:.2f}x")
        return
    with shoal.Pilot(workers=args.workers) as pilot:
        got = count_queens(pilot, args.n, coordination=args.coordination, stats=True,
                           kernel_depth=args.kernel_depth)
    want = OEIS_A000170[args.n]
    print(f"{args.n}-queens: {int(got)} solutions (OEIS A000170: {want}) "
          f"{'ok' if got == want else 'MISMATCH'}; {got.stats.nodes} nodes, "
          f"{got.stats.tasks} tasks, {got.stats.elapsed_s:.2f} s")


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its classes and functions by reference
    import search_nqueens

    search_nqueens.main()
