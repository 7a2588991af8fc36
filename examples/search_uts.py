"""UTS with shoal.patterns.backtracking: count a tree's nodes, checked against its published size.

    python examples/search_uts.py [tree] [--workers 2] [--coordination stack-stealing] [--compare]

The Unbalanced Tree Search benchmark (``shoal.workloads.uts``): a node is its
20-byte SHA-1 RNG state and its height, and ``uts.children`` derives its
children from it, so nothing is stored and any node can be sent to another
worker.  ``tree`` is one of the presets (T3 by default: binomial, 4,112,897
nodes, 1572 levels deep; T1: geometric, 4,130,071 nodes; T1XS, T3XS, T1S, T3S
are small trees for quick runs).  The count goes through the generic skeleton,
``backtracking.count(pilot, root, partial(uts.children, params))``, not through
``uts.count_parallel`` (UTS's own hand-split kernel).

``--compare`` times a hand-written sequential count (an explicit stack over the
same children function: T3 is deeper than Python's default recursion limit)
against 1 and 2 workers and prints the ratios.
"""

from __future__ import annotations

import argparse
import functools
import time

import shoal
from shoal.patterns import backtracking
from shoal.workloads import uts


def count_nodes(pilot, params: uts.UTSParams, **options):
    """The tree's node count, by backtracking.count (a Count: an int with .stats)."""
    return backtracking.count(pilot, uts.root(params), functools.partial(uts.children, params),
                              **options)


def sequential_reference(params: uts.UTSParams) -> int:
    """The hand-written sequential count with the same children(): no skeleton."""
    kids = functools.partial(uts.children, params)
    stack = [uts.root(params)]
    total = 0
    while stack:
        total += 1
        stack.extend(kids(stack.pop()))
    return total


def expected(params: uts.UTSParams) -> tuple[int | None, str]:
    """The tree's known size and where it comes from (None if the preset has none)."""
    if params.name in uts.PUBLISHED:
        return uts.PUBLISHED[params.name].nodes, "published"
    if params.name in uts.DERIVED:
        return uts.DERIVED[params.name].nodes, "regression value"
    return None, ""


def verdict(got: int, want: int | None, source: str) -> str:
    if want is None:
        return "(no published size)"
    return f"({source}: {want:,}) {'ok' if got == want else 'MISMATCH'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", nargs="?", default="T3", help=f"one of {', '.join(uts.PRESETS)}")
    ap.add_argument("--coordination", default="stack-stealing")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--compare", action="store_true", help="time sequential vs 1 and 2 workers")
    args = ap.parse_args()
    try:
        params = uts.UTSParams.preset(args.tree)
    except KeyError as exc:
        raise SystemExit(exc.args[0]) from None
    want, source = expected(params)
    print(f"{params}")
    warm = uts.UTSParams.preset("DEFAULT")  # 1732 nodes: imports the workload in the workers
    if args.compare:
        t = time.perf_counter()
        ref = sequential_reference(params)
        t_seq = time.perf_counter() - t
        print(f"sequential reference: {ref:,} nodes in {t_seq:.2f} s {verdict(ref, want, source)}")
        for w in (1, 2):
            with shoal.Pilot(workers=w) as pilot:
                count_nodes(pilot, warm)
                t = time.perf_counter()
                got = count_nodes(pilot, params, coordination=args.coordination)
                dt = time.perf_counter() - t
            print(f"{w} worker(s): {int(got):,} nodes in {dt:.2f} s: speed-up {t_seq / dt:.2f}x "
                  f"{verdict(got, want, source)}")
        return
    with shoal.Pilot(workers=args.workers) as pilot:
        count_nodes(pilot, warm)
        t = time.perf_counter()
        got = count_nodes(pilot, params, coordination=args.coordination, stats=True)
        dt = time.perf_counter() - t
        workers = pilot.workers
    print(f"{params.name}: {int(got):,} nodes {verdict(got, want, source)}; {workers} worker(s), "
          f"{got.stats.tasks} tasks, {dt:.2f} s")
    if want is not None and got != want:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
