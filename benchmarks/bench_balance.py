"""Balancing between machines: a search whose work sits under one root child, on a dask
pilot of two machines (a LocalCluster of two dask workers, one shoal worker each) next to
a local pilot of two workers.

    python benchmarks/bench_balance.py [--depth 22] [--repeat 3]

The tree: 40 children under the root, the first a complete binary tree ``--depth``
levels deep (2^(depth+1) - 1 nodes), the others single nodes.  The driver deals the
top of the tree out to both machines, so one machine gets nearly all the work; only the
runtime's balancer (shoal/backends/dask/balance.py) can move it, by lending the subtrees
the busy machine's search task keeps spawned (docs/runtime.md, "Balancing between
machines: one owner").  Printed: best-of-``--repeat`` seconds of each pilot, their
ratio (dask / local: 1.0 means moving work between machines costs nothing over one
machine of two workers), the tasks moved in each dask run (``stats.exported``) and,
robust to a loaded machine, the share of the dask runs' time the shoal workers spent
idle waiting for work (from ``pilot.stats()``; 0% is perfect balance, 50% is one
machine doing everything).  Counts are checked exactly.  bench_search.py ``--dask-machines`` runs the same tree at
depth 19 with N-Queens 12 and UTS T3S.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
import warnings

import shoal
from shoal.patterns import backtracking


def lopsided(depth: int, node):
    if node == ():
        return [(i,) for i in range(40)]
    if node[0] != 0 or len(node) > depth:
        return []
    return [node + (0,), node + (1,)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=22)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.depth < 1 or args.repeat < 1:
        raise SystemExit("--depth and --repeat must be >= 1")
    from distributed import LocalCluster

    warnings.filterwarnings("ignore", message="Port 8787 is already in use")
    want = 1 + 39 + 2 ** (args.depth + 1) - 1
    kids = functools.partial(lopsided, args.depth)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, \
            shoal.Pilot(backend="dask", cluster=cluster, workers=1) as dp, shoal.Pilot(2) as lp:
        for p in (dp, lp):  # warm: runtimes started, functions known
            backtracking.count(p, (), functools.partial(lopsided, 8))
        best, moved, idle = {}, [], []
        for which, p in (("local", lp), ("dask", dp)):
            best[which] = float("inf")
            for _ in range(args.repeat):
                idle0 = _idle_s(p)
                t = time.perf_counter()
                r = backtracking.count(p, (), kids, stats=True)
                wall = time.perf_counter() - t
                best[which] = min(best[which], wall)
                if which == "dask":
                    idle.append((_idle_s(p) - idle0) / (2 * wall))
                if int(r) != want:
                    raise SystemExit(f"{which}: counted {int(r)}, want {want}")
                if which == "dask":
                    moved.append(r.stats.exported)
    print(f"lopsided depth {args.depth} ({want:,} nodes), load {os.getloadavg()[0]:.1f}: "
          f"local 2 workers {best['local']:.2f} s, dask 2 machines x 1 worker "
          f"{best['dask']:.2f} s, ratio {best['dask'] / best['local']:.2f}x, moved {moved}, "
          f"dask workers idle {', '.join(f'{x:.0%}' for x in idle)}")


def _idle_s(pilot) -> float:
    """Seconds the pilot's shoal workers have waited for work so far, all together."""
    return sum(w.get("idle_s", 0.0) for w in pilot.stats()["workers"])


if __name__ == "__main__":
    main()
