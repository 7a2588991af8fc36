"""Search skeletons against hand-written sequential Python, multiprocessing.Pool and dask.

    python benchmarks/bench_search.py [--quick] [--workers 2] [--uts T3] [--apps ...] [--no-dask]
    python benchmarks/bench_search.py --cpu-overhead [--apps ...]   # 1-worker overhead, CPU time
    python benchmarks/bench_search.py --dask-machines [--repeat 2]  # 2 dask machines vs local
    python benchmarks/bench_search.py --user [--quick]   # what a user compares, TARGETS table
    ... [--no-tick] [--no-inline]   # the count loop as it was: countdown polls; accept() called

For each app, in one run: the hand-written sequential search (the reference,
no shoal; it inlines accept/objective/bound as attribute reads), the same
search calling the user functions the skeleton is given, shoal with 1 worker
(the skeleton's overhead) and with ``--workers`` workers (default stack
stealing), and what a pool user writes: the tree's top levels expanded in the
driver, then one task per subtree, each searched sequentially without
incumbent sharing -- once with ``multiprocessing.Pool.map`` and once with
dask.distributed (``client.map`` + ``client.gather`` on a LocalCluster of
``--workers`` single-threaded worker processes).

The apps: N-Queens, maximum clique (DIMACS), 0/1 knapsack and UTS (T3 by
default, ``--uts``), the latter through ``backtracking.count`` with
``uts.children``; its count is checked against the published tree size.

Order: every app's reference, 1-worker, N-worker and Pool columns first, with
the pilots and the pool running; then those are closed and one LocalCluster is
started for the dask column of every app, and closed at the end.  A live
cluster's scheduler runs in this process (heartbeats, an event loop), so it
would share the CPU and the GIL with the references timed here.

``--user`` runs, once each, the comparisons a user would make with the functions
they wrote for the skeleton (generator ``children``, ``accept=``): the skeleton on 1
and 2 workers against (a) the same functions run by a plain recursion, (b) a static
``multiprocessing.Pool(2)`` split of that recursion (fork; split depths 1-3 tried, the
fastest kept), (c) for N-Queens a static Pool split of a hand-written bitmask recursion,
which is also the ``kernel=`` timed against it; UTS also as ``shoal.spawn`` code
(benchmarks/bench_uts_spawn.py's ``explore``); max clique on sanr200_0.7, brock200_4,
p_hat300-2, Taillard ta001-ta010 and simple cycles (examples/search_cycles.py) against
the hand-written sequential search.  The 2-process ceiling
(benchmarks/run.py's ``parallel_ceiling``) is measured after every app and an app's
targets use the mean of the ones around it; the 1-worker overhead is judged in CPU
time of the process tree (load does not inflate it), its wall ratio printed beside.

Every time is the best of ``--repeat`` runs; the table prints reference time /
time (higher is better) and, for branch and bound, nodes and work inflation
(nodes / 1-worker nodes).  A second table checks the issue's targets.
"""

from __future__ import annotations

import argparse
import functools
import logging
import multiprocessing
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # before any worker starts: they inherit sys.path

import search_knapsack as ks  # noqa: E402
import search_maxclique as mc  # noqa: E402
import search_nqueens as nq  # noqa: E402

import shoal  # noqa: E402
from shoal._room import in_room  # noqa: E402  (a leaf module: the search package's internals are imported where used)
from shoal.patterns import backtracking  # noqa: E402
from shoal.workloads import uts  # noqa: E402

DIMACS = ROOT / "examples" / "data" / "dimacs"
APPS = ("queens", "clique", "knapsack", "uts")
# the issue's targets for --workers 2: speed-up over the reference, and 1-worker overhead
SPEEDUP_TARGETS = {"UTS T3": 1.85, "N-Queens 14": 1.85, "N-Queens 14, kernel= below depth 3": 1.85,
                   "max clique C125.9": 1.8}
OVERHEAD_TARGET = 1.15  # issue 15 (YewPar reports ~6% generality cost in C++)
KERNEL_DEPTH = 3  # N-Queens with kernel=: the rows the skeleton splits
UTS_STATIC_TASKS = 500  # the static columns expand UTS levels until this many subtrees


# -- sequential searches from a given node (the static tasks and the references) -------


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


def uts_from(params, node) -> int:
    """Nodes of ``node``'s UTS subtree (itself included), with the children() the
    skeleton is given.  An explicit stack, not recursion: T3 is 1572 levels deep,
    past Python's default recursion limit."""
    kids = functools.partial(uts.children, params)
    stack = [node]
    pop, push_all = stack.pop, stack.extend
    total = 0
    while stack:
        total += 1
        push_all(kids(pop()))
    return total


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


def uts_frontier(params, min_tasks: int) -> tuple[int, list, int]:
    """Expand whole levels of the tree until at least ``min_tasks`` nodes are open.

    Returns (nodes expanded here, the open nodes, levels expanded): the tree has
    ``expanded + sum(uts_from(n) for n in open)`` nodes.
    """
    expanded, level, levels = 0, [uts.root(params)], 0
    while level and len(level) < min_tasks:
        expanded += len(level)
        level = [c for nd in level for c in uts.children(params, nd)]
        levels += 1
    return expanded, level, levels


def import_apps() -> None:
    """Run in each dask worker before timing: the imports the tasks need."""
    import search_knapsack  # noqa: F401
    import search_maxclique  # noqa: F401
    import search_nqueens  # noqa: F401

    import shoal.workloads.uts  # noqa: F401


# -- the apps ---------------------------------------------------------------------------
#
# Each app has: reference() -> (value, None); calls() -> value (only where has_calls:
# without user functions besides children it is the reference itself); shoal(pilot) -> (value, nodes); static() -> (job, inputs, combine), the pool user's
# decomposition: ``combine([job(x) for x in inputs])`` is the value.


class App:
    kind = "count"
    has_calls = True

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

    def static(self):
        fr = frontier(functools.partial(nq.children, self.n), nq.ROOT, 2)
        inner = [nd for nd in fr if nd[0] == 2]
        above = sum(1 for nd in fr if nd[0] != 2 and nd[0] == self.n)
        return functools.partial(queens_from, self.n), inner, lambda rs: above + sum(rs)


class QueensKernel(Queens):
    """N-Queens through count(kernel=): the recursion counts subtrees below KERNEL_DEPTH."""

    def __init__(self, n):
        super().__init__(n)
        self.name = f"N-Queens {n}, kernel= below depth {KERNEL_DEPTH}"

    def shoal(self, pilot):
        r = nq.count_queens(pilot, self.n, kernel_depth=KERNEL_DEPTH)
        return int(r), r.stats.nodes


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

    def static(self):
        kids = functools.partial(mc.children, self.g)
        fr = frontier(kids, mc.root(self.g), 1)
        return functools.partial(bnb_from, kids, value_of=mc.size, bound_of=mc.bound), fr, max


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

    def static(self):
        kids = functools.partial(ks.children, self.pr)
        fr = frontier(kids, ks.root(self.pr), 4)
        return functools.partial(bnb_from, kids, value_of=ks.value, bound_of=ks.bound), fr, max


class UTS(App):
    """A UTS tree counted node by node: ``backtracking.count(pilot, root, children)``."""

    has_calls = False  # the skeleton is given children only

    def __init__(self, preset: str):
        try:
            self.params = uts.UTSParams.preset(preset)
        except KeyError as exc:
            raise SystemExit(f"--uts: {exc.args[0]}") from None
        name = self.params.name
        super().__init__(f"UTS {name}")
        known = uts.PUBLISHED.get(name) or uts.DERIVED.get(name)
        self.want = None if known is None else known.nodes

    def check(self, value: int, who: str) -> int:
        if self.want is not None and value != self.want:
            raise SystemExit(f"{self.name}: {who} counted {value:,} nodes, the tree has "
                             f"{self.want:,}")
        return value

    def reference(self):
        return self.check(uts_from(self.params, uts.root(self.params)), "the reference"), None

    def shoal(self, pilot):
        r = backtracking.count(pilot, uts.root(self.params),
                               functools.partial(uts.children, self.params))
        return self.check(int(r), "the skeleton"), r.stats.nodes

    def static(self):
        expanded, fr, _ = uts_frontier(self.params, UTS_STATIC_TASKS)
        return functools.partial(uts_from, self.params), fr, lambda rs: expanded + sum(rs)


def make_apps(args) -> list[App]:
    want = set(args.apps.split(","))
    if not want <= set(APPS):
        raise SystemExit(f"--apps: unknown {sorted(want - set(APPS))}; known: {','.join(APPS)}")
    apps: list[App] = []
    if "queens" in want:
        apps += [Queens(12)] if args.quick else [Queens(13), Queens(14), QueensKernel(14)]
    if "clique" in want:
        apps += [Clique("keller4")] if args.quick else [Clique("C125.9"), Clique("keller4")]
    if "knapsack" in want:
        apps.append(Knapsack(80, 1, "strong"))
    if "uts" in want:
        trees = args.uts or ("T3XS" if args.quick else "T3")
        apps += [UTS(t) for t in trees.split(",")]
    return apps


def best_of(repeat, fn):
    """The best time of ``repeat`` calls of ``fn`` and its result.  Every timed function
    runs via ``in_room`` (room.py), as the skeleton's loops do: then no side pays CPython
    3.11's frame-stack chunk thrash by the accident of how deep it was called."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = in_room(fn)
        times.append(time.perf_counter() - t)
    return min(times), out


def run_static(app, map_fn):
    """One static run: decompose in the driver, map the subtrees, combine."""
    job, inputs, combine = app.static()
    return combine(map_fn(functools.partial(in_room, job), inputs))


def time_local(apps, args) -> dict:
    """The reference, calls, 1-worker, N-worker and Pool columns of every app."""
    rows = {}
    with shoal.Pilot(workers=1) as p1, shoal.Pilot(workers=args.workers) as p2, \
            multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for p in (p1, p2):  # warm up: every worker imports the apps
            for _ in range(2 * p.workers):
                nq.count_queens(p, 6)
        pool_map = functools.partial(pool.map, chunksize=1)
        for app in apps:
            subtrees = len(app.static()[1])
            t_ref, (want, _) = best_of(args.repeat, app.reference)
            if not app.has_calls:
                t_calls, vc = t_ref, want
            else:
                t_calls, vc = best_of(args.repeat, app.calls)
            t1, (v1, n1) = best_of(args.repeat, lambda app=app: app.shoal(p1))
            t2, (v2, n2) = best_of(args.repeat, lambda app=app: app.shoal(p2))
            tp, vp = best_of(args.repeat, lambda app=app: run_static(app, pool_map))
            if not (want == vc == v1 == v2 == vp):
                raise SystemExit(f"{app.name}: results differ: reference {want}, with calls "
                                 f"{vc}, 1 worker {v1}, {args.workers} workers {v2}, Pool {vp}")
            rows[app.name] = dict(want=want, ref=t_ref, calls=t_calls, t1=t1, t2=t2, pool=tp,
                                  n1=n1, n2=n2, dask=None)
            print(f"{app.name}: reference {t_ref:.2f} s, with calls {t_calls:.2f} s, "
                  f"1 worker {t1:.2f} s, {args.workers} workers {t2:.2f} s, Pool {tp:.2f} s "
                  f"({subtrees} subtrees)", flush=True)
    return rows


def time_dask(apps, args, rows: dict) -> None:
    """The dask static column of every app, on one LocalCluster started for them all."""
    from distributed import Client, LocalCluster

    # no dashboard; its HTTP server still binds 8787, or another port if that one is taken
    warnings.filterwarnings("ignore", message="Port 8787 is already in use")
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(args.workers)
        client.run(import_apps)  # on every worker, before anything is timed

        def dask_map(job, inputs):
            futures = client.map(job, inputs, pure=False)
            try:
                return client.gather(futures)
            finally:
                client.cancel(futures)

        for app in apps:
            td, vd = best_of(args.repeat, lambda app=app: run_static(app, dask_map))
            row = rows[app.name]
            if vd != row["want"]:
                raise SystemExit(f"{app.name}: dask static found {vd}, the reference "
                                 f"{row['want']}")
            row["dask"] = td
            print(f"{app.name}: dask static {td:.2f} s", flush=True)


def print_tables(apps, rows: dict, workers: int, dask: bool) -> None:
    w = workers
    print()
    print(f"| app | reference | 1 worker: overhead (vs reference calling the user functions) | "
          f"{w} workers: speed-up | Pool({w}) static: speed-up | dask({w}) static: speed-up | "
          f"B&B nodes 1 -> {w} workers (inflation) |")
    print("|---|---|---|---|---|---|---|")
    for app in apps:
        r = rows[app.name]
        nodes = (f"{r['n1']:,} -> {r['n2']:,} ({r['n2'] / r['n1']:.2f})"
                 if app.kind == "bnb" else "")
        td = f"{r['ref'] / r['dask']:.2f}x" if r["dask"] else "not run"
        print(f"| {app.name} | {r['ref']:.2f} s | {r['t1'] / r['ref']:.2f}x "
              f"({r['t1'] / r['calls']:.2f}x) | {r['ref'] / r['t2']:.2f}x | "
              f"{r['ref'] / r['pool']:.2f}x | {td} | {nodes} |")
    print()
    print("| target | measured | |")
    print("|---|---|---|")
    for app in apps:
        r = rows[app.name]
        over = r["t1"] / r["ref"]
        print(f"| {app.name}: 1-worker overhead <= {OVERHEAD_TARGET}x | {over:.2f}x "
              f"({r['t1'] / r['calls']:.2f}x vs calls) | "
              f"{'met' if over <= OVERHEAD_TARGET else 'missed'} |")
        target = SPEEDUP_TARGETS.get(app.name)
        if target is not None and w == 2:
            s = r["ref"] / r["t2"]
            print(f"| {app.name}: 2 workers >= {target}x over the reference | {s:.2f}x | "
                  f"{'met' if s >= target else 'missed'} |")
        beat = r["pool"] / r["t2"]
        print(f"| {app.name}: {w} workers beat the static Pool split | {beat:.2f}x Pool's "
              f"speed | {'met' if beat > 1 else 'missed'} |")
    if not dask:
        print("\n(dask column not run: --no-dask)")


# -- --cpu-overhead: the skeleton's per-node cost in CPU time, in-process ------------------


class _Cell:
    """A BestCell stand-in for the in-process engine: the driver's own incumbent only."""

    value = float("-inf")

    def offer(self, v):
        if v > self.value:
            self.value = v


def _engine(root, children, goal, **kw):
    """One task's depth-first search in this process (no pilot, no splits): the value."""
    import numpy as np

    from shoal.patterns.search.control import CONTROL_COLUMNS
    from shoal.patterns.search.engine import Explorer
    from shoal.patterns.search.model import Coordination, Goal, SearchSpec

    if goal is Goal.OPTIMISE:  # a fresh incumbent per run (a reused one would prune it all)
        kw["cell"] = _Cell()
    spec = SearchSpec(root=root, children=children, goal=goal, control=None,
                      coordination=Coordination.SEQUENTIAL, **kw)
    ex = Explorer(spec, (), np.zeros((2, CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
    ex.dfs(root)
    return ex.tally.count if goal is Goal.COUNT else ex.tally.best


def cpu_overhead(apps, repeat: int) -> None:
    """The 1-worker overhead as CPU time (``time.process_time``) of the engine's loop run
    in this process against the reference: on a shared machine wall-clock ratios swing
    with other people's load, CPU time much less (no pilot, no polls of other workers)."""
    from shoal.patterns.search.model import Goal

    # as a shoal worker does (runtime/worker.py sizes it to a raised stack): the engine's
    # recursive count loop goes this deep before it hands a subtree to its iterative loop
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))

    def cpu(fn):
        best, out = float("inf"), None
        for _ in range(repeat):
            t = time.process_time()
            out = in_room(fn)  # (best_of)
            best = min(best, time.process_time() - t)
        return best, out

    print(f"| app | reference CPU s | reference calling the user functions CPU s | engine CPU s "
          f"| overhead (target <= {OVERHEAD_TARGET}x) | vs calls | |\n|---|---|---|---|---|---|---|")
    for app in apps:
        if isinstance(app, QueensKernel):
            kids = functools.partial(nq.children, app.n)
            run = functools.partial(_engine, nq.ROOT, kids, Goal.COUNT,
                                    accept=functools.partial(nq.is_solution, app.n),
                                    kernel=functools.partial(nq.count_from, app.n),
                                    kernel_depth=KERNEL_DEPTH)
        elif isinstance(app, Queens):
            run = functools.partial(_engine, nq.ROOT, functools.partial(nq.children, app.n),
                                    Goal.COUNT, accept=functools.partial(nq.is_solution, app.n))
        elif isinstance(app, UTS):
            run = functools.partial(_engine, uts.root(app.params),
                                    functools.partial(uts.children, app.params), Goal.COUNT)
        elif isinstance(app, Clique):
            run = functools.partial(_engine, mc.root(app.g), functools.partial(mc.children, app.g),
                                    Goal.OPTIMISE, objective=mc.size, bound=mc.bound,
                                    prune_level=True)
        else:
            run = functools.partial(_engine, ks.root(app.pr), functools.partial(ks.children, app.pr),
                                    Goal.OPTIMISE, objective=ks.value, bound=ks.bound,
                                    prune_level=True)
        t_ref, (want, _) = cpu(app.reference)
        t_calls, vc = cpu(app.calls) if app.has_calls else (t_ref, want)
        t_eng, got = cpu(run)
        if not got == vc == want:
            raise SystemExit(f"{app.name}: the in-process engine found {got}, the reference {want}, "
                             f"with calls {vc}")
        over = t_eng / t_ref
        print(f"| {app.name} | {t_ref:.2f} | {t_calls:.2f} | {t_eng:.2f} | {over:.2f}x | "
              f"{t_eng / t_calls:.2f}x | {'met' if over <= OVERHEAD_TARGET else 'missed'} |",
              flush=True)
        from shoal.patterns.search import shapes

        if isinstance(app, Knapsack) and shapes.INLINE:  # the same loop calling value/bound
            shapes.INLINE = False
            try:
                t_fn, got = cpu(run)
            finally:
                shapes.INLINE = True
            if not got == want:
                raise SystemExit(f"{app.name}, not inlined: {got}, want {want}")
            print(f"| {app.name}, value/bound called (not inlined) | {t_ref:.2f} | {t_calls:.2f} | "
                  f"{t_fn:.2f} | {t_fn / t_ref:.2f}x | {t_fn / t_calls:.2f}x | "
                  f"{'met' if t_fn / t_ref <= OVERHEAD_TARGET else 'missed'} |", flush=True)


# -- --dask-machines: the skeleton across two machines' runtimes (balancing between them) ---


def lopsided(node):
    """40 subtrees under the root: the first a complete binary tree 20 levels deep, the
    others single nodes -- one machine gets nearly all the work unless work moves."""
    if node == ():
        return [(i,) for i in range(40)]
    if node[0] != 0 or len(node) > 19:
        return []
    return [node + (0,), node + (1,)]


def dask_machines(repeat: int) -> None:
    """backtracking.count on a dask pilot of two machines (a LocalCluster of two dask
    workers, one shoal worker each) next to a local pilot of 2 workers: what balancing
    between machines costs or buys (``stats.exported``: tasks moved between machines)."""
    from distributed import LocalCluster

    warnings.filterwarnings("ignore", message="Port 8787 is already in use")
    t3s = uts.UTSParams.preset("T3S")
    cases = [("N-Queens 12", nq.ROOT, functools.partial(nq.children, 12),
              dict(accept=functools.partial(nq.is_solution, 12)), 14_200),
             ("UTS T3S", uts.root(t3s), functools.partial(uts.children, t3s), {},
              {**uts.PUBLISHED, **uts.DERIVED}["T3S"].nodes),
             ("lopsided (2^20 nodes in 1 of 40 subtrees)", (), lopsided, {}, 1 + 39 + 2 ** 20 - 1)]
    print(f"# load average {os.getloadavg()[0]:.1f}")
    print("| tree | local 2 workers | dask 2 machines x 1 worker | moved between machines |")
    print("|---|---|---|---|")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, \
            shoal.Pilot(backend="dask", cluster=cluster, workers=1) as dp, shoal.Pilot(2) as lp:
        for p in (dp, lp):
            backtracking.count(p, nq.ROOT, functools.partial(nq.children, 8))
        for name, root, kids, kw, want in cases:
            times, moved = {}, []
            for which, p in (("local", lp), ("dask", dp)):
                best = float("inf")
                for _ in range(repeat):
                    t = time.perf_counter()
                    r = backtracking.count(p, root, kids, stats=True, **kw)
                    best = min(best, time.perf_counter() - t)
                    if int(r) != want:
                        raise SystemExit(f"{name} on {which}: {int(r)}, want {want}")
                    if which == "dask":
                        moved.append(r.stats.exported)
                times[which] = best
            print(f"| {name} | {times['local']:.2f} s | {times['dask']:.2f} s | {moved} |",
                  flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f}")


# -- --user: the comparisons a user would make, one run each --------------------------------
#
# Every app as a user writes it for the skeleton (generator children, accept=, bounds read
# from the node) on 1 and 2 workers, next to what the same user would otherwise run: (a)
# the same functions called by a plain recursion, (b) a static multiprocessing.Pool split
# of that recursion, (c) for N-Queens a static Pool split of a hand-written bitmask
# recursion, which is also the kernel= a user is pointed to; for UTS the same count written
# with shoal.spawn; for branch and bound the example's hand-written sequential search.

USER_TARGETS = {  # the issue's targets, against the 2-process ceiling measured in the run
    "overhead": 1.10,  # 1 worker / (a), every app
    "pool": 0.95,  # 2 workers >= 0.95x the static Pool split of (a)
    "ceiling": 0.90,  # 2 workers >= 0.9 x ceiling over (a) (counting apps)
    "kernel": 1.00,  # kernel= on 2 workers >= the static Pool split (c)
    "bnb": 0.85,  # branch and bound on 2 workers >= 0.85 x ceiling over the sequential search
    "cycles": 0.85,  # cycle counting on 2 workers >= 0.85 x ceiling over the same recursion
}
USER_CLIQUES = ("sanr200_0.7", "brock200_4", "p_hat300-2")
SPLIT_DEPTHS = (1, 2, 3)  # the static splits' depths tried; the fastest is kept


def queens_bits(n: int, row: int, cols: int, ld: int, rd: int) -> int:
    """N-Queens hand-written: a bitmask recursion, no node objects, no generators."""
    if row == n:
        return 1
    full = (1 << n) - 1
    avail = full & ~(cols | ld | rd)
    total = 0
    while avail:
        bit = avail & -avail
        avail ^= bit
        total += queens_bits(n, row + 1, cols | bit, ((ld | bit) << 1) & full, (rd | bit) >> 1)
    return total


def queens_bits_node(n: int, node) -> int:
    """queens_bits from a skeleton node (row, cols, ld, rd): the kernel= and (c)'s job."""
    return queens_bits(n, *node)


def bnb_min_from(children, node, value_of, bound_of, best):
    """Least value below ``best`` in ``node``'s subtree (minimising, prune_level)."""

    def rec(nd) -> None:
        nonlocal best
        for c in children(nd):
            if bound_of(c) >= best:
                return
            v = value_of(c)
            if v < best:
                best = v
            rec(c)

    rec(node)
    return best


def flowshop_sequential(fs, p) -> int:
    """ta00x by hand: NEH, then the bidirectional search of solve_bidirectional, sequential,
    the bound and objective read from the node."""
    upper, _ = fs.neh(p)
    bp = fs.bi_problem(p, upper + 1)
    best = upper + 1

    def rec(nd) -> None:
        nonlocal best
        for c in fs.bi_children(bp, nd):
            if c.lb >= best:
                return  # children come in non-decreasing bound order
            if c.left == 0:
                best = c.lb
            rec(c)

    rec(fs.bi_root(bp))
    return best


def static_split(pool, children, root, job, depth) -> int:
    """A pool user's split: the nodes at ``depth`` (and shallower leaves) one task each;
    ``job(node)`` counts a node's subtree, the node included."""
    return sum(pool.map(functools.partial(in_room, job), frontier(children, root, depth),
                        chunksize=1))


def user_comparisons(args) -> None:
    import bench_uts_spawn as spawn_uts
    import psutil
    import run as bench_run  # benchmarks/run.py: parallel_ceiling
    import search_cycles as cy
    import search_flowshop as fs

    me = psutil.Process()

    def cpu_now() -> float:
        """CPU seconds of this process and its children (the pilots' workers, the pool's)."""
        total = 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                ct = proc.cpu_times()
            except psutil.Error:
                continue
            total += ct.user + ct.system
        return total

    def timed(t: dict, key: str, fn):
        """fn() once; its wall seconds added to t[key], its CPU seconds to t["cpu " + key]."""
        c0, w0 = cpu_now(), time.perf_counter()
        out = in_room(fn)
        t[key] = t.get(key, 0.0) + time.perf_counter() - w0
        t["cpu " + key] = t.get("cpu " + key, 0.0) + cpu_now() - c0
        return out

    quick = args.quick
    qn = 12 if quick else 14
    tree = args.uts or ("T3S" if quick else "T3")
    cliques = ("p_hat300-2", "brock200_4") if quick else USER_CLIQUES
    tais = range(4) if quick else range(10)
    cyc = (12, 0.5, 1) if quick else (14, 0.5, 1)
    load0 = os.getloadavg()
    ceil0 = bench_run.parallel_ceiling()
    print(f"# --user{' --quick' if quick else ''}: load average {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f}; 2-process ceiling {ceil0:.2f} (2.00 = two idle cores); "
          f"{os.cpu_count()} CPUs", flush=True)
    rows = []  # (app, kind, {column: seconds}, note)

    def row(app, kind, times, note=""):
        times["ceiling"] = bench_run.parallel_ceiling()  # this app's minute, not the run's
        rows.append((app, kind, times, note))
        print(f"{app}: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()
                                     if not k.startswith("cpu "))
              + (f" ({note})" if note else ""), flush=True)

    # fork: the fastest start on Linux, and the pool is started and warmed before timing
    with multiprocessing.get_context("fork").Pool(2) as pool, \
            shoal.Pilot(workers=1) as p1, shoal.Pilot(workers=2) as p2:
        pool.map(abs, range(4), chunksize=1)
        for p in (p1, p2):  # warm up: every worker imports the apps and the engine
            for _ in range(2 * p.workers):
                nq.count_queens(p, 6)
                cy.count_cycles(p, cy.random_digraph(6, 0.5, 1))

        # N-Queens: generator children + accept=
        kids, acc = functools.partial(nq.children, qn), functools.partial(nq.is_solution, qn)
        want = nq.OEIS_A000170[qn]
        t = {}
        v = timed(t, "a", functools.partial(queens_calls, qn, nq.ROOT))
        assert v == want, v
        for w, p in ((1, p1), (2, p2)):
            v = timed(t, f"skel{w}", functools.partial(nq.count_queens, p, qn))
            assert v == want, v
        best_b = best_c = None
        for d in SPLIT_DEPTHS:
            for col, job in (("b", queens_calls), ("c", queens_bits_node)):
                v = timed(t, f"{col}{d}", functools.partial(
                    static_split, pool, kids, nq.ROOT, functools.partial(job, qn), d))
                assert v == want, v
        best_b = min(SPLIT_DEPTHS, key=lambda d: t[f"b{d}"])
        best_c = min(SPLIT_DEPTHS, key=lambda d: t[f"c{d}"])
        t["b"], t["c"] = t[f"b{best_b}"], t[f"c{best_c}"]
        v = timed(t, "kernel2", lambda: backtracking.count(
            p2, nq.ROOT, kids, accept=acc, kernel=functools.partial(queens_bits_node, qn),
            kernel_depth=KERNEL_DEPTH))
        assert v == want, v
        v = timed(t, "seq_c", functools.partial(queens_bits, qn, 0, 0, 0, 0))
        assert v == want, v
        row(f"N-Queens {qn}", "count", t, f"(b) split at depth {best_b}, (c) at depth "
            f"{best_c}; kernel= below depth {KERNEL_DEPTH}")

        # UTS: backtracking.count(root, children) and the same count with shoal.spawn
        params = uts.UTSParams.preset(tree)
        app = UTS(tree)
        t = {}
        v = timed(t, "a", app.reference)
        for w, p in ((1, p1), (2, p2)):
            _ = timed(t, f"skel{w}", functools.partial(app.shoal, p))
        v = timed(t, "b", functools.partial(run_static, app, functools.partial(pool.map,
                                                                                chunksize=1)))
        app.check(v, "the Pool split")
        for w, p in ((1, p1), (2, p2)):
            v = timed(t, f"spawn{w}", lambda p=p: p.submit(
                spawn_uts.explore, params, [uts.root(params)], spawn_uts.CHUNK).result())
            app.check(v, f"shoal.spawn on {w} worker(s)")
        row(f"UTS {tree}", "count", t, f"(b) {UTS_STATIC_TASKS}+ subtrees")

        # max clique: children in bound order, prune_level=True
        for name in cliques:
            g = mc.read_dimacs(DIMACS / f"{name}.clq")
            t = {}
            want = timed(t, "a", functools.partial(mc.sequential_reference, g))
            nodes = []
            for w, p in ((1, p1), (2, p2)):
                r = timed(t, f"skel{w}", functools.partial(mc.max_clique, p, g, stats=True))
                assert r.value == want, (name, r.value, want)
                nodes.append(r.stats.nodes)
            row(f"max clique {name}", "bnb", t, f"omega {want}; nodes {nodes[0]:,} -> "
                f"{nodes[1]:,} on 2 workers")

        # Taillard ta001..: bidirectional branching from NEH, every instance proved optimal
        t = {}
        for i in tais:
            p = fs.taillard(fs.TA20x5_SEEDS[i], 20, 5)
            v = timed(t, "a", functools.partial(flowshop_sequential, fs, p))
            assert v == fs.TA20x5_OPTIMA[i], (i, v)
            for w, pl in ((1, p1), (2, p2)):
                r = timed(t, f"skel{w}", functools.partial(fs.solve_bidirectional, pl, p))
                assert r.value == fs.TA20x5_OPTIMA[i], (i, r.value)
        row(f"Taillard ta001-ta{tais[-1] + 1:03d}", "bnb-flowshop", t,
            "sum over the instances, each proved optimal")

        # simple cycles: fine-grained path extensions
        g = cy.random_digraph(*cyc)
        t = {}
        want = timed(t, "a", functools.partial(cy.count_sequential, g))
        for w, p in ((1, p1), (2, p2)):
            v = timed(t, f"skel{w}", functools.partial(cy.count_cycles, p, g))
            assert v == want, (v, want)
        v = timed(t, "johnson", functools.partial(cy.count_johnson, g))
        assert v == want, (v, want)
        row(f"simple cycles G({cyc[0]}, {cyc[1]}) seed {cyc[2]}", "cycles", t,
            f"{want:,} cycles")

    load1 = os.getloadavg()
    after = ", ".join(f"{t['ceiling']:.2f}" for _, _, t, _ in rows)
    print(f"\n# load average {load0[0]:.2f} at start, {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f} at end; 2-process ceiling {ceil0:.2f} at start, then after each "
          f"app: {after} (an app's targets "
          f"use the mean of the ceilings before and after it)\n")
    before = ceil0
    for _, _, t, _ in rows:
        t["ceiling"], before = (before + t["ceiling"]) / 2, t["ceiling"]
    print_user_tables(rows)


def print_user_tables(rows) -> None:
    """The user comparisons as markdown: times as speed-ups over (a), then the TARGETS."""

    def x(v):
        return "" if v is None else f"{v:.2f}x"

    print("| app | (a) plain recursion | 1 worker / (a): wall (CPU) | 2 workers: speed-up over "
          "(a) | (b) Pool(2) split of (a) | (c) Pool(2) split, bitmask recursion | kernel= 2 "
          "workers | shoal.spawn 1 worker / (a), 2 workers | ceiling | |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for app, _, t, note in rows:
        a = t["a"]
        sp = (f"{x(t['spawn1'] / a)}, {x(a / t['spawn2'])}" if "spawn2" in t else "")
        print(f"| {app} | {a:.2f} s | {x(t['skel1'] / a)} ({x(t['cpu skel1'] / t['cpu a'])}) | "
              f"{x(a / t['skel2'])} | {x(a / t['b']) if 'b' in t else ''} | "
              f"{x(a / t['c']) if 'c' in t else ''} | "
              f"{x(a / t['kernel2']) if 'kernel2' in t else ''} | {sp} | {t['ceiling']:.2f} | "
              f"{note} |")
    print()
    print("| target | measured | |\n|---|---|---|")
    tg = USER_TARGETS

    def line(what, got, ok):
        print(f"| {what} | {got} | {'met' if ok else 'not met'} |")

    for app, kind, t, _ in rows:
        a, ceil = t["a"], t["ceiling"]
        over, over_cpu = t["skel1"] / a, t["cpu skel1"] / t["cpu a"]
        line(f"{app}: 1 worker <= {tg['overhead']:.2f}x (a), CPU time (wall)",
             f"{over_cpu:.2f}x ({over:.2f}x)", over_cpu <= tg["overhead"])
        s2 = a / t["skel2"]
        if kind == "count":
            line(f"{app}: 2 workers >= {tg['pool']:.2f}x the speed of (b)",
                 f"{t['b'] / t['skel2']:.2f}x", t["b"] / t["skel2"] >= tg["pool"])
            line(f"{app}: 2 workers >= {tg['ceiling']:.2f} x ceiling over (a)",
                 f"{s2:.2f}x = {s2 / ceil:.2f} x ceiling", s2 >= tg["ceiling"] * ceil)
        if "kernel2" in t:
            k = t["c"] / t["kernel2"]
            line(f"{app}: kernel= on 2 workers >= {tg['kernel']:.2f}x the speed of (c)",
                 f"{k:.2f}x", k >= tg["kernel"])
        if kind == "bnb":
            line(f"{app}: 2 workers >= {tg['bnb']:.2f} x ceiling over the sequential search",
                 f"{s2:.2f}x = {s2 / ceil:.2f} x ceiling", s2 >= tg["bnb"] * ceil)
        if kind == "cycles":
            line(f"{app}: 2 workers >= {tg['cycles']:.2f} x ceiling over the same recursion",
                 f"{s2:.2f}x = {s2 / ceil:.2f} x ceiling", s2 >= tg["cycles"] * ceil)
    for app, _, t, _ in rows:  # for the reader: the hand-written alternatives' own speed
        if "seq_c" in t:
            print(f"\n{app}: the bitmask recursion alone, sequential, runs "
                  f"{t['a'] / t['seq_c']:.2f}x the speed of (a)")
        if "johnson" in t:
            print(f"\n{app}: Johnson's algorithm (blocked set, B-lists), sequential, runs "
                  f"{t['a'] / t['johnson']:.2f}x the speed of (a)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="N-Queens 12, keller4 (no C125.9), UTS T3XS unless --uts is given")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--apps", default=",".join(APPS),
                    help=f"comma-separated subset of {','.join(APPS)} (default: all)")
    ap.add_argument("--uts", default=None,
                    help="comma-separated UTS presets (default T3, T3XS with --quick); "
                         f"known: {', '.join(uts.PRESETS)}")
    ap.add_argument("--no-dask", action="store_true", help="skip the dask static column")
    ap.add_argument("--cpu-overhead", action="store_true",
                    help="only the 1-worker overhead, as CPU time of the engine in-process")
    ap.add_argument("--user", action="store_true",
                    help="only the comparisons a user would make (N-Queens, UTS, max clique, "
                         "Taillard, simple cycles; one run each) and their TARGETS table")
    ap.add_argument("--dask-machines", action="store_true",
                    help="only the skeleton on a 2-machine dask pilot vs a local one")
    ap.add_argument("--no-inline", action="store_true",
                    help="the loops call accept()/objective()/bound() instead of inlining a "
                         "one-expression function (shapes.py; SHOAL_SEARCH_INLINE=0 for the workers)")
    ap.add_argument("--no-tick", action="store_true",
                    help="the count loop counts down to its polls at every node instead of being "
                         "armed by the native ticker (patterns/search/ticked.py; "
                         "SHOAL_SEARCH_TICK=0 for the workers)")
    args = ap.parse_args()
    if args.no_tick:  # before any worker starts: they inherit the environment
        os.environ["SHOAL_SEARCH_TICK"] = "0"
        from shoal import _tick

        _tick.ENABLED = False
        print("# the countdown count loop, not the ticked one (--no-tick)")
    if args.no_inline:  # before any worker starts: they inherit the environment
        from shoal.patterns.search import shapes

        os.environ["SHOAL_SEARCH_INLINE"] = "0"
        shapes.INLINE = False
        print("# accept() called, not inlined (--no-inline)")
    if args.workers < 1 or args.repeat < 1:
        raise SystemExit("--workers and --repeat must be >= 1")
    if args.dask_machines:
        return dask_machines(args.repeat)
    if args.user:
        return user_comparisons(args)
    apps = make_apps(args)
    if not apps:
        raise SystemExit("no apps to run")
    if args.cpu_overhead:
        print(f"# CPU-time overhead, in-process; load average {os.getloadavg()[0]:.1f}")
        cpu_overhead(apps, args.repeat)
        return
    rows = time_local(apps, args)
    if not args.no_dask:
        time_dask(apps, args, rows)
    print_tables(apps, rows, args.workers, not args.no_dask)


if __name__ == "__main__":
    # run main() from the module imported by name, so that the workers (which inherit
    # this sys.path) can unpickle its functions (the kernel=) by reference
    import bench_search

    bench_search.main()
