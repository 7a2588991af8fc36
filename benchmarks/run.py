"""shoal next to its peers, in one run, on one machine: ratios, not absolute times.

Usage::

    python benchmarks/run.py [--workers 1,2] [--only startup,tiny,map,map_defaults,ring,uts,nqueens,fib,overhead]
                             [--quick] [--repeat 3] [--markdown bench.md] [--dashboard]

``--dashboard``: every shoal pilot serves its live dashboard, with the workers page
open in a headless Chromium on this machine (when one is installed) for the whole run;
``benchmarks/bench_dashboard.py`` alternates runs with and without it.

Sections (``--only`` picks some):

* ``tiny``: 20,000 ``inc(x)`` tasks on 2 workers, each its own future, then wait
  for all -- shoal ``Pilot.submit`` vs ``ProcessPoolExecutor.submit``,
  ``multiprocessing.Pool.map(chunksize=1)``, dask delayed on the threads and
  processes schedulers, dask.distributed ``client.map`` + ``gather`` (a
  LocalCluster of 2 single-threaded worker processes).  Tasks/s and shoal's
  rate divided by each peer's.
* ``map``: ``Pilot.map`` vs ``Pool.map`` / ``ProcessPoolExecutor.map`` with
  automatic chunk sizes, and ``dask.bag``.
* ``map_defaults``: does ``Pilot.map`` without ``chunksize`` come within 0.9x of the
  best fixed ``chunksize``?  Two regimes, 10^6 tiny items (``inc``) and 10^4 items of
  1 ms of CPU each (a calibrated spin): a sequential loop, ``Pool.imap`` at the best
  chunksize of a small sweep, ``Pilot.map`` default, ``Pilot.map`` at the best
  chunksize of the same sweep (all timings interleaved, best of ``--repeat``), with
  the load and the 2-process ceiling before and after (~6 min).
* ``integrations``: dask graphs on shoal (``scheduler=pilot.get`` and
  ``scheduler=pilot``) vs dask's threads and processes schedulers: 2,000 tiny
  ``delayed`` tasks, and a CPU-bound pure-Python graph; ``joblib.Parallel`` on
  the ``shoal`` backend vs loky and threading.
* ``ring``: ``benchmarks/ring_bench.py``'s ``run(messages, size)`` (the queue
  layer's own benchmark; skipped when the file is absent).
* ``uts`` / ``nqueens`` / ``fib``: recursive workloads (T3, N-Queens 14,
  fib(32) with a cutoff; ``--quick``: T3S, 12, fib(30)).  Per worker count:
  shoal with nested ``spawn`` and work stealing vs the sequential code in this
  process vs a *static* decomposition (one task per root child / first-row
  queen / fib leaf) on ``multiprocessing.Pool`` and on dask.distributed.
  ``--workers 1,2,4,8,16`` gives a scaling curve.
* ``overhead``: microseconds per nested ``spawn`` + run + join of an empty task
  on 1 worker (``fib.empty_tree``), next to a driver-side submit.

Method: every pool, pilot and cluster is started and warmed before it is timed
(start-up is not what is compared).  Each timing is the best of ``--repeat``
runs (fewer when one run is slow: each measurement gets ~10 s), since noise on a
small shared machine only ever adds time.  Every result is checked (counts vs
the sequential answer) so a fast wrong runner cannot win.  Peers that are not
installed are reported as skipped, not silently dropped.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime
import functools
import importlib
import logging
import multiprocessing as mp
import os
import pathlib
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, str(HERE.parent))

import shoal  # noqa: E402
from shoal.workloads import fib, nqueens, uts  # noqa: E402

SECTIONS = ("startup", "tiny", "map", "map_defaults", "integrations", "ring", "uts", "nqueens", "fib", "overhead")
TINY_WORKERS = 2
MEASURE_BUDGET_S = 10.0  # stop repeating a measurement after this much time


def inc(x):
    return x + 1


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells) -> None:
        self.rows.append(list(cells))


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


def render_text(t: Table) -> str:
    """Aligned plain text: words to the left, numbers to the right."""
    cells = [t.columns] + [[fmt(c) for c in r] for r in t.rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(t.columns))]
    out = [f"== {t.title}", "  ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)),
           "  ".join("-" * w for w in widths)]
    for raw, r in zip(t.rows, cells[1:], strict=True):
        out.append("  ".join(c.ljust(w) if isinstance(v, str) else c.rjust(w)
                             for v, c, w in zip(raw, r, widths, strict=True)))
    out += [f"   {n}" for n in t.notes]
    return "\n".join(out)


def render_markdown(t: Table) -> str:
    words = [any(isinstance(r[i], str) for r in t.rows) or not t.rows
             for i in range(len(t.columns))]
    out = [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |",
           "|" + "|".join("---" if w else "---:" for w in words) + "|"]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in t.rows]
    if t.notes:
        out += [""] + [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def ratio(a, b):
    """a / b, or None where either is missing."""
    return None if not a or not b else a / b


# ---------------------------------------------------------------------------
# timing and the runners (started once, warmed, reused, closed at the end)
# ---------------------------------------------------------------------------


def best_of(fn, repeat: int, check=None) -> float:
    """Best wall time of up to ``repeat`` calls (fewer once MEASURE_BUDGET_S is spent)."""
    best, spent = float("inf"), 0.0
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        value = fn()
        dt = time.perf_counter() - t0
        if check is not None and value != check:
            raise AssertionError(f"{fn} returned {value!r}, expected {check!r}")
        best, spent = min(best, dt), spent + dt
        if spent > MEASURE_BUDGET_S:
            break
    return best


class Runners:
    """Pilots, pools and clusters by worker count; each started and warmed on first use."""

    def __init__(self, dashboard: bool = False):
        self.stack = contextlib.ExitStack()
        self.cache: dict = {}
        self.dashboard = dashboard
        # Peers run in each start method; tables keep the fastest (fork is often 3x
        # faster than forkserver for Pool.map(chunksize=1), never a weakened config).
        self.methods = [m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()]
        self.dask_error = None
        try:
            import dask  # noqa: F401
            import distributed  # noqa: F401
        except ImportError as exc:
            self.dask_error = f"dask/distributed not installed ({exc})"

    def _get(self, key, make):
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def pilot(self, w: int):
        def make():
            p = self.stack.enter_context(shoal.Pilot(workers=w, dashboard=0 if self.dashboard else None))
            if self.dashboard:
                self.watch(p.dashboard_url + "workers")
            list(p.map(inc, range(8 * w)))
            p.submit(inc, 0).result()
            return p
        return self._get(("pilot", w), make)

    def watch(self, url: str) -> None:
        """Open ``url`` in this run's one headless Chromium (started on first use), if any."""
        if "browser" not in self.cache:
            self.cache["browser"] = self.stack.enter_context(chromium())
        ctx = self.cache["browser"]
        if ctx is None:
            print(f"   (no Chromium/playwright: dashboard served at {url}, no page open)", flush=True)
            return
        page = ctx.new_page()
        page.goto(url)
        page.wait_for_selector("tr.worker")

    def pool(self, w: int, method: str = "forkserver"):
        def make():
            pool = self.stack.enter_context(mp.get_context(method).Pool(w))
            pool.map(inc, range(4 * w), chunksize=1)
            return pool
        return self._get(("pool", w, method), make)

    def ppe(self, w: int, method: str = "forkserver"):
        def make():
            ex = self.stack.enter_context(cf.ProcessPoolExecutor(w, mp_context=mp.get_context(method)))
            list(ex.map(inc, range(4 * w)))
            return ex
        return self._get(("ppe", w, method), make)

    def fastest(self, kind: str, w: int, timed, repeat: int, check=None) -> tuple[float, str]:
        """Best time of ``timed(runner)`` over the start methods of peer ``kind``
        ("pool" or "ppe"), and the method that gave it."""
        out = []
        for method in self.methods:
            runner = getattr(self, kind)(w, method)
            out.append((best_of(lambda runner=runner: timed(runner), repeat, check), method))
        return min(out)

    @contextlib.contextmanager
    def dask(self, w: int):
        """A dask.distributed Client on a LocalCluster of ``w`` 1-thread processes, or None.

        Started per use and closed right after: an idle cluster still heartbeats,
        and its scheduler shares this process (and the GIL) with what is timed next.
        """
        if self.dask_error:
            yield None
            return
        from distributed import Client, LocalCluster
        with LocalCluster(n_workers=w, threads_per_worker=1, processes=True,
                          dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
                Client(cluster) as client:
            client.gather(client.map(inc, range(4 * w), pure=False))
            yield client

    def close(self):
        self.stack.close()


@contextlib.contextmanager
def chromium():
    """A headless Chromium of this machine driven by playwright (one per run: playwright's
    sync API cannot nest), or None without Chromium or playwright."""
    import shutil

    exe = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        exe = None
    if exe is None:
        yield None
        return
    import tempfile

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=exe, headless=True,
            args=["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic", "--disable-gpu"])
        try:
            time.sleep(3.0)  # its own start-up work settles before anything is timed
            yield ctx
        finally:
            ctx.close()


# ---------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------


def section_tiny(args, run: Runners) -> list[Table]:
    w = TINY_WORKERS
    n = 5_000 if args.quick else 20_000
    R = args.repeat
    t = Table(f"tiny tasks: inc(x), one future per task, {w} workers",
              ["runner", "tasks", "best s", "tasks/s", "shoal ÷ peer"])
    expect = sum(range(1, n + 1))
    rates: list[tuple[str, int, float | None, str | None]] = []

    pilot = run.pilot(w)
    rates.append(("shoal Pilot.submit", n, best_of(
        lambda: sum(f.result() for f in [pilot.submit(inc, i) for i in range(n)]), R, expect), None))
    secs, how = run.fastest("ppe", w, lambda ex: sum(f.result() for f in [ex.submit(inc, i)
                                                                          for i in range(n)]), R, expect)
    rates.append((f"ProcessPoolExecutor.submit ({how})", n, secs, None))
    secs, how = run.fastest("pool", w, lambda pool: sum(pool.map(inc, range(n), chunksize=1)), R, expect)
    rates.append((f"multiprocessing Pool.map(chunksize=1) ({how})", n, secs, None))
    fast_ppe = run.ppe(w, run.fastest("ppe", w, lambda ex: sum(ex.map(inc, range(200))), 1)[1])
    if run.dask_error:
        for name in ("dask delayed, threads", "dask delayed, processes", "dask.distributed map"):
            rates.append((name, 0, None, run.dask_error))
    else:
        import dask
        from dask import delayed
        # the processes scheduler gets a warm pool (by default it starts one per compute)
        for sched, cap, kw in (("threads", min(n, 2_000 if args.quick else 8_000),
                                {"num_workers": w}),
                               ("processes", min(n, 2_000 if args.quick else 8_000),
                                {"pool": fast_ppe})):
            exp = sum(range(1, cap + 1))
            rates.append((f"dask delayed, {sched} scheduler", cap, best_of(
                lambda sched=sched, cap=cap, kw=kw: sum(dask.compute(
                    *[delayed(inc)(i) for i in range(cap)], scheduler=sched, **kw)),
                R, exp), None))
        cap = min(n, 1_000 if args.quick else 4_000)
        with run.dask(w) as client:
            rates.append(("dask.distributed client.map + gather", cap, best_of(
                lambda: sum(client.gather(client.map(inc, range(cap), pure=False))), R,
                sum(range(1, cap + 1))), None))
    shoal_rate = n / rates[0][2]
    for name, count, secs, skipped in rates:
        if secs is None:
            t.add(name, None, None, None, f"skipped: {skipped}")
            continue
        rate = count / secs
        t.add(name, count, secs, rate, None if name.startswith("shoal") else ratio(shoal_rate, rate))
    t.notes.append("shoal ÷ peer > 1: shoal completes more tasks per second.  Peers slower than "
                   "~1,000 tasks/s run fewer tasks (rates compare; counts are in the table).  "
                   "Pools run in their fastest start method (in parentheses).")
    peer = {name.split(" (")[0]: count / secs for name, count, secs, _ in rates if secs}
    ppe, pool = peer.get("ProcessPoolExecutor.submit"), peer.get("multiprocessing Pool.map(chunksize=1)")
    for what, got, goal in (("submit >= 100,000 tasks/s", shoal_rate, 100_000),
                            ("submit >= 10x ProcessPoolExecutor", ratio(shoal_rate, ppe), 10.0),
                            ("submit >= 2.5x Pool.map(chunksize=1)", ratio(shoal_rate, pool), 2.5)):
        verdict = "MET" if got is not None and got >= goal else "MISSED"
        t.notes.append(f"issue 13 target: {what}: {fmt(got)} {verdict} (same run; "
                       "benchmarks/bench_submit.py decides with more rounds)")
    return [t]


def section_map(args, run: Runners) -> list[Table]:
    w = TINY_WORKERS
    n = 50_000 if args.quick else 200_000
    R = args.repeat
    expect = sum(range(1, n + 1))
    auto = max(1, -(-n // (4 * w)))  # Pool.map's own rule: ceil(n / (4 * workers))
    t = Table(f"map: {n:,} x inc(x) with automatic batching, {w} workers",
              ["runner", "items", "best s", "items/s", "shoal ÷ peer"])
    rows = []
    pilot = run.pilot(w)
    rows.append(("shoal Pilot.map (adaptive batches)", best_of(
        lambda: sum(pilot.map(inc, range(n))), R, expect)))
    secs, how = run.fastest("pool", w, lambda pool: sum(pool.map(inc, range(n))), R, expect)
    rows.append((f"multiprocessing Pool.map (auto chunksize, {how})", secs))
    secs, how = run.fastest("ppe", w, lambda ex: sum(ex.map(inc, range(n), chunksize=auto)), R, expect)
    rows.append((f"ProcessPoolExecutor.map(chunksize={auto}, {how})", secs))
    ex = run.ppe(w, how)
    if not run.dask_error:
        import dask.bag as db
        rows.append((f"dask.bag map, processes ({4 * w} partitions)", best_of(
            lambda: sum(db.from_sequence(range(n), npartitions=4 * w).map(inc)
                        .compute(scheduler="processes", pool=ex)), R, expect)))
        with run.dask(w) as client:
            rows.append((f"dask.bag map, distributed ({4 * w} partitions)", best_of(
                lambda: sum(db.from_sequence(range(n), npartitions=4 * w).map(inc)
                            .compute(scheduler=client)), R, expect)))
    shoal_s = rows[0][1]
    for name, secs in rows:
        t.add(name, n, secs, n / secs, None if name.startswith("shoal") else ratio(secs, shoal_s))
    if run.dask_error:
        t.notes.append(f"dask rows skipped: {run.dask_error}")
    return [t]


def busy_inc(steps: int, x: int) -> int:
    """``x + 1`` after ``steps`` of CPU-bound pure Python (a spin, not a sleep: it needs a core)."""
    s = 0
    for i in range(steps):
        s += i
    return x + 1


def spin_steps(seconds: float) -> int:
    """How many ``busy_inc`` steps take ``seconds`` of CPU here, timed the way the map
    section runs them (20 calls in a row, best of 5: a shared machine only ever makes a
    try slower)."""
    steps = 20_000
    for _ in range(3):
        best = min(_busy_seconds(steps, 20) for _ in range(5)) / 20
        steps = max(100, int(steps * seconds / best))
    return steps


def _busy_seconds(steps: int, calls: int) -> float:
    fn = functools.partial(busy_inc, steps)
    t0 = time.perf_counter()
    sum(map(fn, range(calls)))
    return time.perf_counter() - t0


def interleaved_times(timed: dict, rounds: int, check, budget_s: float = 3 * MEASURE_BUDGET_S) -> dict:
    """Wall times of each of ``timed``'s calls, run in turns (``rounds`` rounds, fewer for
    a call once it has spent ``budget_s``): a burst of load from other users of the
    machine slows one round of every call, not every round of one call.  Returns each
    call's list of times (its best is ``min``)."""
    times: dict = {name: [] for name in timed}
    for _ in range(max(rounds, 1)):
        for name, fn in timed.items():
            if sum(times[name]) > budget_s:
                continue
            t0 = time.perf_counter()
            value = fn()
            times[name].append(time.perf_counter() - t0)
            if value != check:
                raise AssertionError(f"{name} returned {value!r}, expected {check!r}")
    return times


MAP_DEFAULT_GOAL = 0.9  # Pilot.map without chunksize, as a share of the best fixed chunksize's speed


def section_map_defaults(args, run: Runners) -> list[Table]:
    w = TINY_WORKERS
    R = args.repeat
    steps = spin_steps(0.001)
    regimes = (  # label, function, items, the chunksize sweep, rounds (tiny ones are cheap)
        ("tiny items: inc(x)", inc, 100_000 if args.quick else 1_000_000, (1000, 4000, 16000, 64000),
         5 * R),
        ("~1 ms items: a CPU spin calibrated to 1 ms, then x + 1", functools.partial(busy_inc, steps),
         2_000 if args.quick else 10_000, (1, 8, 64, 512), R if args.quick else max(R, 5)),
    )
    pilot = run.pilot(w)
    how = run.fastest("pool", w, lambda pool: sum(pool.imap(inc, range(4000), chunksize=500)), 1)[1]
    pool = run.pool(w, how)
    load0, ceil0 = os.getloadavg()[0], parallel_ceiling(w)
    t = Table(f"map defaults: Pilot.map without chunksize vs the best fixed chunksize, {w} workers",
              ["items", "runner", "chunksize", "best s", "items/s", "÷ sequential"])
    verdicts = []
    for label, fn, n, sweep, rounds in regimes:
        expect = sum(range(1, n + 1))
        timed = {"sequential": lambda fn=fn, n=n: sum(map(fn, range(n))),
                 "pilot default": lambda fn=fn, n=n: sum(pilot.map(fn, range(n)))}
        for c in sweep:
            timed[f"pool {c}"] = lambda fn=fn, n=n, c=c: sum(pool.imap(fn, range(n), chunksize=c))
            timed[f"pilot {c}"] = lambda fn=fn, n=n, c=c: sum(pilot.map(fn, range(n), chunksize=c))
        times = interleaved_times(timed, rounds, expect)
        best = {name: min(ts) for name, ts in times.items()}
        seq = best["sequential"]
        pool_c = min(sweep, key=lambda c: best[f"pool {c}"])
        pilot_c = min(sweep, key=lambda c: best[f"pilot {c}"])
        items = f"{n:,} {label}"
        per_item = f"{seq / n * 1e6:.3g} µs" if seq / n < 1e-3 else f"{seq / n * 1e3:.3g} ms"
        for runner, chunk, secs in (("sequential loop: sum(map(fn, items))", None, seq),
                                    (f"multiprocessing Pool.imap ({how}), best of the sweep", pool_c,
                                     best[f"pool {pool_c}"]),
                                    ("shoal Pilot.map, default (adaptive)", "adaptive", best["pilot default"]),
                                    ("shoal Pilot.map, best of the sweep", pilot_c, best[f"pilot {pilot_c}"])):
            t.add(items, runner, chunk, secs, n / secs, seq / secs)
        share = best[f"pilot {pilot_c}"] / best["pilot default"]
        verdicts.append(f"{label} ({per_item} each in the loop): default ÷ best fixed = {share:.2f}x the speed, "
                        f"{'MET' if share >= MAP_DEFAULT_GOAL else 'MISSED'} (goal >= {MAP_DEFAULT_GOAL}x); "
                        "sweep: " + ", ".join(f"{c}: pilot {best[f'pilot {c}']:.3g} s, "
                                              f"pool {best[f'pool {c}']:.3g} s" for c in sweep)
                        + f"; every round, default: {', '.join(f'{x:.3g}' for x in times['pilot default'])} s, "
                        f"chunksize={pilot_c}: {', '.join(f'{x:.3g}' for x in times[f'pilot {pilot_c}'])} s")
    load1, ceil1 = os.getloadavg()[0], parallel_ceiling(w)
    t.notes += verdicts
    t.notes.append(f"load {load0:.2f} before, {load1:.2f} after; {w}-process ceiling {ceil0:.2f} before, "
                   f"{ceil1:.2f} after ({w}.00 = {w} idle cores); spin: {steps:,} steps = 1 ms here")
    t.notes.append("every call above ran in turns with the others, best of the rounds kept "
                   "(noise on a shared machine only adds time)")
    return [t]


def spin(n):
    """CPU-bound pure Python (holds the GIL: threads cannot run two at once)."""
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def section_integrations(args, run: Runners) -> list[Table]:
    """dask graphs and joblib on shoal vs the schedulers/backends those tools bring."""
    w = TINY_WORKERS
    R = args.repeat
    tables = []
    pilot = run.pilot(w)
    if run.dask_error:
        t = Table("dask graphs on shoal", ["graph", "scheduler", "best s", "shoal pilot.get ÷ peer"])
        t.notes.append(f"skipped: {run.dask_error}")
        return [t]
    import dask
    from dask import delayed

    n = 500 if args.quick else 2_000
    k = 20_000 if args.quick else 200_000
    t = Table(f"dask graphs on shoal, {w} workers (dask.compute on a built graph: dask's "
              "optimisation included, what each scheduler costs the user)",
              ["graph", "scheduler", "best s", "peer ÷ shoal pilot.get"])

    def tiny():
        return delayed(sum)([delayed(inc)(i) for i in range(n)])

    def cpu():
        return delayed(sum)([delayed(spin)(k) for _ in range(4 * w)])

    _, ppe_how = run.fastest("ppe", w, lambda ex: sum(ex.map(inc, range(200))), 1)
    for label, make in ((f"delayed: {n:,} x inc + sum", tiny), (f"delayed: {4 * w} x spin({k:,}) + sum", cpu)):
        g = make()  # built once: building delayed objects is not the scheduler's cost
        expect = dask.compute(g, scheduler="sync")[0]
        rows = [
            ("shoal pilot.get", best_of(lambda g=g: dask.compute(g, scheduler=pilot.get)[0],
                                        R, expect)),
            ("shoal pilot (Executor protocol)", best_of(
                lambda g=g: dask.compute(g, scheduler=pilot)[0], R, expect)),
            (f"dask threads ({w})", best_of(lambda g=g: dask.compute(
                g, scheduler="threads", num_workers=w)[0], R, expect)),
            (f"dask processes ({ppe_how}, warm pool)", best_of(lambda g=g: dask.compute(
                g, scheduler="processes", pool=run.ppe(w, ppe_how))[0], R, expect)),
        ]
        shoal_s = rows[0][1]
        for name, secs in rows:
            t.add(label, name, secs, None if name == "shoal pilot.get" else ratio(secs, shoal_s))
    t.notes.append("peer ÷ shoal > 1: shoal's pilot.get is faster")
    tables.append(t)

    try:
        import joblib

        import shoal.integrations.joblib  # noqa: F401  (registers backend "shoal")
    except ImportError as exc:
        t = Table("joblib on shoal", ["work", "backend", "best s", "loky ÷ shoal"])
        t.notes.append(f"skipped: joblib not installed ({exc})")
        return tables + [t]
    t = Table(f"joblib.Parallel on shoal, n_jobs={w} (loky's workers reused, like the pilot)",
              ["work", "backend", "best s", "peer ÷ shoal"])
    m = 2_000 if args.quick else 20_000
    c = 8 * w
    for label, make, expect in (
            (f"{m:,} x inc", lambda: (joblib.delayed(inc)(i) for i in range(m)), list(range(1, m + 1))),
            (f"{c} x spin({k:,})", lambda: (joblib.delayed(spin)(k) for _ in range(c)), [spin(k)] * c)):
        rows = []
        for backend, kw in (("shoal", {"pilot": pilot}), ("loky", {}), ("threading", {})):
            with joblib.parallel_config(backend=backend, n_jobs=w, **kw):
                par = joblib.Parallel()
                par(make())  # warm
                rows.append((backend, best_of(lambda par=par, make=make: par(make()), R, expect)))
        shoal_s = rows[0][1]
        for name, secs in rows:
            t.add(label, name, secs, None if name == "shoal" else ratio(secs, shoal_s))
    t.notes.append("peer ÷ shoal > 1: shoal is faster")
    tables.append(t)
    return tables


def section_ring(args, run: Runners) -> list[Table]:
    t = Table("rings: benchmarks/ring_bench.py run(messages, size)", ["size B", "result"])
    try:
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        ring_bench = importlib.import_module("ring_bench")
        bench = ring_bench.run
    except (ImportError, AttributeError) as exc:
        t.notes.append(f"skipped: benchmarks/ring_bench.py with run(messages, size) not available ({exc})")
        return [t]
    messages = 20_000 if args.quick else 200_000
    rows: list[dict] = []
    for size in (64, 1024, 16384):
        result = bench(messages, size)  # a list of dicts (one per transport), a dict or a number
        if isinstance(result, dict):
            result = [result]
        if isinstance(result, (list, tuple)) and all(isinstance(r, dict) for r in result):
            rows += [{"size B": size, **{k: v for k, v in r.items() if k != "size"}}
                     for r in result]
        else:
            rows.append({"size B": size, "result": result})
    t.columns = list(dict.fromkeys(k for r in rows for k in r))
    for r in rows:
        t.add(*[r.get(c) for c in t.columns])
    t.notes.append(f"{messages:,} messages per size; numbers as ring_bench.run reports them")
    return [t]


@dataclass
class Workload:
    """A recursive workload: its sequential code, shoal version and static split."""

    name: str
    title: str
    seq: object  # () -> answer
    expect: object
    shoal: object  # (pilot) -> answer
    static_fn: object  # item -> partial answer (picklable)
    static_items: list
    static_label: str
    combine: object = sum  # partial answers -> answer
    notes: list[str] = field(default_factory=list)
    seq_s: float | None = None  # timed before any pool, pilot or cluster exists


def _uts_sum(stats) -> int:
    return 1 + sum(s.nodes for s in stats)  # + the root, which the static split does not visit


def workload_uts(args) -> Workload:
    p = uts.UTSParams.preset(args.uts or ("T3S" if args.quick else "T3"))
    expect = uts.DERIVED.get(p.name) or uts.PUBLISHED.get(p.name)
    expect = expect.nodes if expect else uts.count_sequential(p)
    kids = [[k] for k in uts.children(p, uts.root(p))]
    return Workload(
        "uts", f"UTS {p.name} ({expect:,} nodes; {p.to_args()})",
        lambda: uts.count_sequential(p), expect, lambda pilot: uts.count_parallel(pilot, p),
        functools.partial(uts.search_from, p), kids, f"one task per root child ({len(kids)})",
        combine=_uts_sum, notes=[f"shoal cutoff {uts.DEFAULT_CUTOFF} nodes per task burst"])


def workload_nqueens(args) -> Workload:
    n = 12 if args.quick else 14
    subs = nqueens.subproblems(n, 1)
    return Workload(
        "nqueens", f"N-Queens {n} ({nqueens.OEIS_A000170[n]:,} solutions)",
        lambda: nqueens.count_sequential(n), nqueens.OEIS_A000170[n],
        lambda pilot: nqueens.count_parallel(pilot, n),
        nqueens.count_subproblem, subs, f"one task per first-row queen ({len(subs)})",
        notes=[f"shoal spawn_depth {nqueens.DEFAULT_SPAWN_DEPTH}"])


def workload_fib(args) -> Workload:
    n, cutoff = (31, fib.DEFAULT_CUTOFF) if args.quick else (35, fib.DEFAULT_CUTOFF)
    leaves = fib.fib_frontier(n, cutoff)
    return Workload(
        "fib", f"fib({n}), sequential below n < {cutoff}",
        lambda: fib.fib_sequential(n), fib.fib_value(n),
        lambda pilot: fib.fib_parallel(pilot, n, cutoff),
        fib.fib_sequential, leaves, f"one task per leaf ({len(leaves)})")


WORKLOADS = {"uts": workload_uts, "nqueens": workload_nqueens, "fib": workload_fib}


def run_workload(wl: Workload, args, run: Runners) -> list[Table]:
    """Sequential vs shoal vs static decomposition (Pool, dask.distributed), per worker count."""
    R, expect = args.repeat, wl.expect
    t = Table(wl.title, ["runner", "workers", "best s", "speed-up", "efficiency",
                         "static ÷ shoal"])
    seq = wl.seq_s if wl.seq_s is not None else best_of(wl.seq, R, expect)
    t.add("sequential, this process", 1, seq, 1.0, 1.0, None)
    for w in args.workers:
        pilot = run.pilot(w)
        s = best_of(lambda pilot=pilot: wl.shoal(pilot), R, expect)
        t.add("shoal spawn + work stealing", w, s, seq / s, seq / s / w, None)
        p, how = run.fastest("pool", w, lambda pool: wl.combine(pool.map(wl.static_fn, wl.static_items,
                                                                          chunksize=1)), R, expect)
        t.add(f"Pool.map ({how}), {wl.static_label}", w, p, seq / p, seq / p / w, p / s)
        with run.dask(w) as client:
            if client is not None:
                d = best_of(lambda client=client: wl.combine(client.gather(
                    client.map(wl.static_fn, wl.static_items, pure=False))), R, expect)
                t.add(f"dask.distributed, {wl.static_label}", w, d, seq / d, seq / d / w, d / s)
    t.notes.append("sequential: timed in this process before any pool, pilot or cluster started; "
                   "speed-up: sequential s ÷ runner s; static ÷ shoal > 1: shoal beats the "
                   "static split with as many workers")
    t.notes += wl.notes
    if run.dask_error:
        t.notes.append(f"dask rows skipped: {run.dask_error}")
    return [t]


def section_overhead(args, run: Runners) -> list[Table]:
    n = 5_000 if args.quick else 20_000
    R = args.repeat
    t = Table("overhead per task, 1 worker", ["what", "tasks", "µs per task"])
    pilot = run.pilot(1)
    base = best_of(lambda: fib.empty_tree(pilot, 0), R, 0)
    nested = best_of(lambda: fib.empty_tree(pilot, n), R, n)
    t.add("shoal nested spawn + run + join (empty task)", n, (nested - base) / n * 1e6)
    drv = best_of(lambda: sum(f.result() for f in [pilot.submit(inc, i) for i in range(n)]),
                  R, sum(range(1, n + 1)))
    t.add("shoal Pilot.submit from the driver, inc(x)", n, drv / n * 1e6)
    ex = run.ppe(1)
    m = min(n, 5_000)
    ppe = best_of(lambda: sum(f.result() for f in [ex.submit(inc, i) for i in range(m)]),
                  R, sum(range(1, m + 1)))
    t.add("ProcessPoolExecutor.submit, inc(x)", m, ppe / m * 1e6)
    # Wake-up: one task submitted to an idle pilot whose workers are parked (asleep).
    trips = []
    for _ in range(20):
        time.sleep(0.02)  # longer than the workers' spin: they are asleep now
        t0 = time.perf_counter()
        pilot.submit(inc, 1).result()
        trips.append(time.perf_counter() - t0)
    trips.sort()
    t.add("round trip to a parked worker (median of 20)", 20, trips[10] * 1e6)
    t.notes.append("nested: (empty_tree(n) - empty_tree(0)) / n, the task machinery alone")
    t.notes.append("round trip: submit + wake the sleeping worker + run + result back to the driver")
    return [t]


def section_startup(args, run: Runners) -> list[Table]:
    """Start a 2-worker pool, run one task, shut it down: what a short script pays."""
    import concurrent.futures as cf
    import multiprocessing as mp

    R = max(3, args.repeat)
    t = Table("start-up + first task + shutdown, 2 workers", ["runner", "best s", "shoal ÷ peer"])

    def shoal_cycle():
        with shoal.Pilot(workers=2) as p:
            return p.submit(inc, 1).result()

    def ppe_cycle():
        with cf.ProcessPoolExecutor(2) as ex:
            return ex.submit(inc, 1).result()

    def pool_cycle():
        with mp.Pool(2) as pool:
            return pool.apply(inc, (1,))

    mine = best_of(shoal_cycle, R, 2)
    t.add("shoal Pilot", mine, "-")
    for name, fn in (("ProcessPoolExecutor", ppe_cycle), ("multiprocessing.Pool", pool_cycle)):
        peer = best_of(fn, R, 2)
        t.add(name, peer, peer / mine)
    t.notes.append("shoal ÷ peer > 1: shoal is faster")
    return [t]


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def machine() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = [f"Python {platform.python_version()}", f"shoal {shoal.__version__}"]
    for mod in ("dask", "distributed"):
        with contextlib.suppress(ImportError):
            versions.append(f"{mod} {importlib.import_module(mod).__version__}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs ({usable} usable), "
            f"load {load:.2f}; " + ", ".join(versions))


def _spin_seconds(n: int) -> float:
    """CPU-bound pure Python for ``n`` steps; its own wall seconds (for parallel_ceiling)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - t0


def parallel_ceiling(procs: int = 2, n: int = 2_000_000) -> float:
    """CPUs' worth of work ``procs`` processes get now: sum over them of (one spin alone /
    their spin when all run at once).  ``procs`` on an idle machine with that many cores;
    other users' load pulls it down, and with it the best speedup anything can show in
    the same minute.  Print it beside results measured on a shared machine."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        pool.map(_spin_seconds, [1000] * procs)  # started and imported before timing
        alone = min(pool.apply(_spin_seconds, (n,)) for _ in range(2))
        together = pool.map(_spin_seconds, [n] * procs, chunksize=1)
    return sum(alone / t for t in together)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2",
                    help="worker counts for the workload sections, e.g. 1,2,4,8,16")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections: {','.join(SECTIONS)}")
    ap.add_argument("--quick", action="store_true", help="smaller problems, one run each")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per measurement, best kept (default 3; 1 with --quick)")
    ap.add_argument("--uts", default=None, help="UTS preset (default T3; T3S with --quick)")
    ap.add_argument("--dashboard", action="store_true",
                    help="shoal pilots serve their dashboard, its workers page open in a headless "
                         "Chromium (the dashboard's overhead: compare with a run without)")
    ap.add_argument("--markdown", default=None, metavar="OUT.md",
                    help="also write the tables as markdown to this file (docs/benchmarks.md keeps one table per benchmark: copy the new tables into its sections, do not point this at it)")
    args = ap.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not args.workers or min(args.workers) < 1:
        ap.error("--workers needs positive integers")
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python benchmarks/run.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = [f"command: {command}", f"machine: {machine()}", f"date:    {when}"]
    print("\n".join(header), flush=True)
    tables: list[Table] = []
    # sequential references first, while this process runs nothing else (no pilot
    # pump thread, no dask scheduler sharing the GIL)
    workloads = {name: WORKLOADS[name](args) for name in args.only if name in WORKLOADS}
    for wl in workloads.values():
        wl.seq_s = best_of(wl.seq, args.repeat, wl.expect)
    run = Runners(dashboard=args.dashboard)
    try:
        for name in args.only:
            t0 = time.perf_counter()
            section = (functools.partial(run_workload, workloads[name]) if name in workloads
                       else globals()[f"section_{name}"])
            for table in section(args, run):
                tables.append(table)
                print("\n" + render_text(table), flush=True)
            print(f"   ({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    finally:
        run.close()
    if args.markdown:
        md = ["# shoal benchmarks", "", "```", *header, "```", "",
              "Ratios are what to read: the machine is small and shared, absolute times drift.", ""]
        md += [render_markdown(t) for t in tables]
        pathlib.Path(args.markdown).write_text("\n".join(md))
        print(f"\nmarkdown written to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
