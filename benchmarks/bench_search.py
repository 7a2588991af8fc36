"""Search skeletons against hand-written sequential Python and a static multiprocessing.Pool.

    python benchmarks/bench_search.py [--quick] [--workers 2]

For each app, in one run: the hand-written recursive search (the reference,
no shoal; it inlines accept/objective/bound as attribute reads), the same
recursion calling the user functions the skeleton is given, shoal with 1 worker (the skeleton's overhead) and with ``--workers``
workers (default stack stealing), and what a pool user writes: the tree's top
levels expanded in the driver, then one ``Pool.map`` task per subtree, each
searched sequentially without incumbent sharing.  Every time is the best of
``--repeat`` runs; the table prints reference time / time (higher is better)
and, for branch and bound, nodes and work inflation (nodes / 1-worker nodes).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import search_knapsack as ks  # noqa: E402
import search_maxclique as mc  # noqa: E402
import search_nqueens as nq  # noqa: E402

import shoal  # noqa: E402

DIMACS = ROOT.parent / "shared" / "data" / "dimacs"


# -- sequential searches from a given node (the pool's tasks and the references) ------


def queens_from(n: int, node) -> int:
    kids = functools.partial(nq.children, n)

    def rec(nd) -> int:
        total = 1 if nd[0] == n else 0
        for c in kids(nd):
            total += rec(c)
        return total

    return rec(node)


def queens_calls(n: int, node) -> int:
    """As queens_from, but calling the same accept() the skeleton is given."""
    kids = functools.partial(nq.children, n)
    accept = functools.partial(nq.is_solution, n)

    def rec(nd) -> int:
        total = 1 if accept(nd) else 0
        for c in kids(nd):
            total += rec(c)
        return total

    return rec(node)


def bnb_from(children, node, value_of, bound_of) -> int:
    """Best value in ``node``'s subtree (maximising, prune_level), starting from nothing."""
    best = value_of(node)

    def rec(nd) -> None:
        nonlocal best
        for c in children(nd):
            if bound_of(c) <= best:
                return
            v = value_of(c)
            if v > best:
                best = v
            rec(c)

    rec(node)
    return best


def frontier(children, root, depth: int) -> list:
    """The nodes at ``depth`` (and the leaves above it), in depth-first order."""
    level = [root]
    shallow = []
    for _ in range(depth):
        nxt = []
        for nd in level:
            kids = list(children(nd))
            if kids:
                nxt.extend(kids)
            else:
                shallow.append(nd)
        level = nxt
    return shallow + level


# -- the apps ---------------------------------------------------------------------------


class App:
    kind = "count"

    def __init__(self, name):
        self.name = name


class Queens(App):
    def __init__(self, n):
        super().__init__(f"N-Queens {n}")
        self.n = n

    def reference(self):
        return queens_from(self.n, nq.ROOT), None

    def calls(self):
        return queens_calls(self.n, nq.ROOT)

    def shoal(self, pilot):
        r = nq.count_queens(pilot, self.n)
        return int(r), r.stats.nodes

    def pool(self, pool):
        fr = frontier(functools.partial(nq.children, self.n), nq.ROOT, 2)
        inner = [nd for nd in fr if nd[0] == 2]
        above = sum(1 for nd in fr if nd[0] != 2 and nd[0] == self.n)
        return above + sum(pool.map(functools.partial(queens_from, self.n), inner, chunksize=1))


class Clique(App):
    kind = "bnb"

    def __init__(self, name):
        super().__init__(f"max clique {name}")
        self.g = mc.read_dimacs(DIMACS / f"{name}.clq")

    def reference(self):
        return mc.sequential_reference(self.g), None

    def calls(self):
        return bnb_from(functools.partial(mc.children, self.g), mc.root(self.g), mc.size, mc.bound)

    def shoal(self, pilot):
        r = mc.max_clique(pilot, self.g)
        return r.value, r.stats.nodes

    def pool(self, pool):
        kids = functools.partial(mc.children, self.g)
        fr = frontier(kids, mc.root(self.g), 1)
        job = functools.partial(bnb_from, kids, value_of=mc.size, bound_of=mc.bound)
        return max(pool.map(job, fr, chunksize=1))


class Knapsack(App):
    kind = "bnb"

    def __init__(self, n, seed, kind):
        super().__init__(f"knapsack {kind} {n} (seed {seed})")
        self.pr = ks.problem(*ks.generate(n, seed, kind))

    def reference(self):
        return ks.sequential_reference(self.pr), None

    def calls(self):
        return bnb_from(functools.partial(ks.children, self.pr), ks.root(self.pr), ks.value,
                        ks.bound)

    def shoal(self, pilot):
        r = ks.solve(pilot, self.pr)
        return r.value, r.stats.nodes

    def pool(self, pool):
        kids = functools.partial(ks.children, self.pr)
        fr = frontier(kids, ks.root(self.pr), 4)
        job = functools.partial(bnb_from, kids, value_of=ks.value, bound_of=ks.bound)
        return max(pool.map(job, fr, chunksize=1))


def best_of(repeat, fn):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N-Queens 12, keller4 and no C125.9")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    apps = [Queens(12 if args.quick else 13), Clique("keller4"), Knapsack(80, 1, "strong")]
    if not args.quick:
        apps[1:1] = [Queens(14), Clique("C125.9")]
    rows = []
    with shoal.Pilot(workers=1) as p1, shoal.Pilot(workers=args.workers) as p2, \
            multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for p in (p1, p2):  # warm up: every worker imports the apps
            for _ in range(2 * p.workers):
                nq.count_queens(p, 6)
        for app in apps:
            t_ref, (want, _) = best_of(args.repeat, app.reference)
            t_calls, vc = best_of(args.repeat, app.calls)
            t1, (v1, n1) = best_of(args.repeat, lambda app=app: app.shoal(p1))
            t2, (v2, n2) = best_of(args.repeat, lambda app=app: app.shoal(p2))
            tp, vp = best_of(args.repeat, lambda app=app: app.pool(pool))
            if not (want == vc == v1 == v2 == vp):
                raise SystemExit(f"{app.name}: results differ: {want} {vc} {v1} {v2} {vp}")
            rows.append((app, t_ref, t_calls, t1, t2, tp, n1, n2))
            print(f"{app.name}: reference {t_ref:.2f} s, with calls {t_calls:.2f} s, 1 worker {t1:.2f} s, "
                  f"{args.workers} workers {t2:.2f} s, Pool {tp:.2f} s", flush=True)
    w = args.workers
    print()
    print(f"| app | reference | 1 worker: overhead (vs reference calling the user functions) | "
          f"{w} workers: speed-up | Pool({w}) static: speed-up | "
          f"B&B nodes 1 -> {w} workers (inflation) |")
    print("|---|---|---|---|---|---|")
    for app, t_ref, t_calls, t1, t2, tp, n1, n2 in rows:
        nodes = f"{n1:,} -> {n2:,} ({n2 / n1:.2f})" if app.kind == "bnb" else ""
        print(f"| {app.name} | {t_ref:.2f} s | {t1 / t_ref:.2f}x ({t1 / t_calls:.2f}x) | "
              f"{t_ref / t2:.2f}x | "
              f"{t_ref / tp:.2f}x | {nodes} |")


if __name__ == "__main__":
    main()
