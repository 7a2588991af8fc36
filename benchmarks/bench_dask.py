"""shoal's dask backend next to plain dask and the local backend: one run, ratios.

Usage::

    python benchmarks/bench_dask.py [--tasks 20000] [--queens 12] [--submits 2000] [--repeat 2]
                                    [--search-queens 14] [--uts T3] [--no-search]

On one LocalCluster (2 worker processes x 1 thread, the shape of this 2-core machine):

* ``map``: 20,000 tiny tasks -- shoal-on-dask ``Pilot.map`` (batched: a batch is one dask
  task spread over the node runtime) vs plain dask ``client.map`` + ``gather`` (one dask
  task per item), and vs the local backend's ``Pilot.map``.
* ``submit``: 2,000 tiny ``Pilot.submit`` calls, each its own future (no batching), on
  the dask backend vs the local backend -- the per-task cost of each.
* ``nqueens``: ``shoal.workloads.nqueens.count_parallel(pilot, 12)`` -- one root task
  whose spawned tree stays on one node -- on the dask backend vs the local backend.
* ``search``: N-Queens 14 and UTS T3 through the search skeleton
  (``backtracking.count``: on two nodes the driver splits the top of the tree into
  groups, one dask task each, and the incumbent/stop cells span the nodes) and UTS T3
  through ``uts.count_parallel`` (one root task, its spawned tree on one node), on the
  dask backend vs the local backend.  Timed once each (they take seconds).

Every pool is started and warmed before it is timed; each timing is the best of
``--repeat`` runs; every result is checked.
"""

from __future__ import annotations

import argparse
import functools
import logging
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "examples"))  # the workers inherit sys.path

import search_nqueens as nq  # noqa: E402  (examples/: the apps of the search benchmarks)

import shoal  # noqa: E402
from shoal.patterns import backtracking  # noqa: E402
from shoal.workloads import nqueens, uts  # noqa: E402


def inc(x):
    return x + 1


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--submits", type=int, default=2000)
    ap.add_argument("--queens", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--search-queens", type=int, default=14)
    ap.add_argument("--uts", default="T3", help="a UTS tree of shoal.workloads.uts.PUBLISHED")
    ap.add_argument("--no-search", action="store_true", help="skip the search rows")
    ap.add_argument("--only-search", action="store_true", help="only the search rows")
    args = ap.parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    from distributed import Client, LocalCluster

    n, want = args.tasks, sum(range(1, args.tasks + 1))
    queens_want = nqueens.OEIS_A000170[args.queens]
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client, \
            shoal.Pilot(backend="dask", cluster=cluster, workers=1) as dpilot, \
            shoal.Pilot(2) as lpilot:
        if args.only_search:
            return print_table(search_rows(args, dpilot, lpilot))

        def plain_dask():
            futs = client.map(inc, range(n), pure=False)
            assert sum(client.gather(futs)) == want
            del futs

        def shoal_map(pilot):
            assert sum(pilot.map(inc, range(n))) == want

        def submits(pilot):
            futs = [pilot.submit(inc, i) for i in range(args.submits)]
            assert sum(f.result() for f in futs) == sum(range(1, args.submits + 1))

        def queens(pilot):
            assert nqueens.count_parallel(pilot, args.queens) == queens_want

        for warm in (plain_dask, lambda: shoal_map(dpilot), lambda: shoal_map(lpilot),
                     lambda: submits(dpilot), lambda: queens(dpilot), lambda: queens(lpilot)):
            warm()
        t_plain = best(plain_dask, args.repeat)
        t_dmap = best(lambda: shoal_map(dpilot), args.repeat)
        t_lmap = best(lambda: shoal_map(lpilot), args.repeat)
        t_dsub = best(lambda: submits(dpilot), args.repeat)
        t_lsub = best(lambda: submits(lpilot), args.repeat)
        t_dq = best(lambda: queens(dpilot), args.repeat)
        t_lq = best(lambda: queens(lpilot), args.repeat)
        search = [] if args.no_search else search_rows(args, dpilot, lpilot)

    rows.append((f"{n:,} tiny tasks: shoal-on-dask map vs plain dask client.map+gather",
                 f"{n / t_dmap:,.0f}/s vs {n / t_plain:,.0f}/s", t_plain / t_dmap))
    rows.append((f"{n:,} tiny tasks: map, dask backend vs local backend",
                 f"{n / t_dmap:,.0f}/s vs {n / t_lmap:,.0f}/s", t_lmap / t_dmap))
    rows.append((f"{args.submits:,} tiny submits, dask backend vs local backend",
                 f"{args.submits / t_dsub:,.0f}/s vs {args.submits / t_lsub:,.0f}/s",
                 t_lsub / t_dsub))
    rows.append((f"N-Queens {args.queens} (count_parallel), dask backend vs local backend",
                 f"{t_dq * 1e3:,.0f} ms vs {t_lq * 1e3:,.0f} ms", t_lq / t_dq))
    print_table(rows + search)


def print_table(rows) -> None:
    print("| workload | rates / times | ratio (higher: dask backend / shoal-on-dask faster) |")
    print("|---|---|---|")
    for what, detail, ratio in rows:
        print(f"| {what} | {detail} | {ratio:.2f}x |")


def search_rows(args, dpilot, lpilot) -> list:
    """N-Queens and UTS through the skeleton, UTS through its spawn tree: dask vs local."""
    q = args.search_queens
    q_kids = functools.partial(nq.children, q)
    params = uts.UTSParams.preset(args.uts)
    u_want = {**uts.PUBLISHED, **uts.DERIVED}[args.uts].nodes
    u_kids = functools.partial(uts.children, params)
    cases = [(f"N-Queens {q} (backtracking.count)",
              lambda p: backtracking.count(p, nq.ROOT, q_kids,
                                           accept=functools.partial(nq.is_solution, q)),
              nqueens.OEIS_A000170[q])]
    cases.append((f"UTS {args.uts} (backtracking.count)",
                  lambda p: backtracking.count(p, uts.root(params), u_kids), u_want))
    cases.append((f"UTS {args.uts} (uts.count_parallel, one spawn tree)",
                  lambda p: uts.count_parallel(p, params), u_want))
    rows = []
    for what, run, want in cases:
        times = {}
        for name, pilot in (("dask", dpilot), ("local", lpilot)):
            t0 = time.perf_counter()
            got = run(pilot)
            times[name] = time.perf_counter() - t0
            assert got == want, (what, name, got, want)
        rows.append((f"{what}, dask backend vs local backend",
                     f"{times['dask']:.2f} s vs {times['local']:.2f} s",
                     times["local"] / times["dask"]))
        print(f"  {what}: dask {times['dask']:.2f} s, local {times['local']:.2f} s", flush=True)
    return rows


if __name__ == "__main__":
    main()
