"""The dashboard's overhead: the same work with the dashboard closed and open, interleaved.

Usage::

    python benchmarks/bench_dashboard.py [--pairs 6] [--tiny 20000] [--uts T3S] [--no-browser]

Per pair, in A-B / B-A order (so drift in the machine's load hits both alike): a fresh
2-worker pilot without a dashboard (A), and one with ``dashboard=0`` and its workers
page open in a headless Chromium on this machine (B, unless ``--no-browser``; the
browser is started once, before any timing, and a page is opened per B pilot); each
runs benchmarks/run.py's two shoal workloads: ``tiny`` (N ``inc(x)`` submits, one future
each) and ``uts`` (``uts.count_parallel``: nested spawn and work stealing), best of 2.
Reported: per workload the median over pairs of B ÷ A (1.02 = 2% slower with the
dashboard open) in wall time and in CPU time (driver + workers; far less sensitive to
other users' load), the pairs' spread, the load average before and after, and the CPU
the dashboard's own threads and the browser use per second of tiny-task work.
Results are checked (a fast wrong run cannot win).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import run as bench_run  # noqa: E402  (benchmarks/run.py: inc, chromium, machine)

import shoal  # noqa: E402
from shoal.workloads import uts  # noqa: E402


def _cpu_s() -> float:
    """CPU seconds of this process and its shoal workers (not the browser, not playwright's
    driver: they are the page's cost, which ``cpu_accounting`` reports on its own)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for p in me.children(recursive=True):
        try:
            if "shoal.runtime.worker" in " ".join(p.cmdline()[:3]):
                total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def best_of(fn, k: int, expect) -> tuple[float, float]:
    """(best wall seconds, least CPU seconds of driver + workers) over ``k`` runs.  CPU time
    is far less sensitive than wall time to other users' load on a shared machine."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(k):
        c0, t0 = _cpu_s(), time.perf_counter()
        got = fn()
        dt, dc = time.perf_counter() - t0, _cpu_s() - c0
        if got != expect:
            raise AssertionError(f"wrong result {got!r}, expected {expect!r}")
        best, best_cpu = min(best, dt), min(best_cpu, dc)
    return best, best_cpu


def measure(dashboard: bool, browser, n_tiny: int, params, expect_nodes: int) -> dict:
    """One pilot's timings; ``browser``: a running headless Chromium (a page is opened on
    the dashboard for the measurement, closed after), or None."""
    with shoal.Pilot(2, dashboard=0 if dashboard else None) as pilot:
        page = None
        if dashboard and browser is not None:
            page = browser.new_page()
            page.goto(pilot.dashboard_url + "workers")
            page.wait_for_selector("tr.worker")
        try:
            list(pilot.map(bench_run.inc, range(16)))
            time.sleep(1.0)  # let the page connect and the sampler run before timing
            tiny, tiny_cpu = best_of(lambda: sum(f.result() for f in [
                pilot.submit(bench_run.inc, i) for i in range(n_tiny)]), 2, sum(range(1, n_tiny + 1)))
            u, u_cpu = best_of(lambda: uts.count_parallel(pilot, params), 2, expect_nodes)
        finally:
            if page is not None:
                page.close()
    return {"tiny": tiny, "uts": u, "tiny cpu": tiny_cpu, "uts cpu": u_cpu}


@contextlib.contextmanager
def chromium(enabled: bool):
    """One headless Chromium for the whole run (benchmarks/run.py's), or None."""
    if not enabled:
        yield None
        return
    with bench_run.chromium() as ctx:
        if ctx is None:
            print("(no Chromium/playwright: the dashboard is served, no page is open)")
        yield ctx


def cpu_accounting(browser, n_tiny: int, seconds: float = 10.0) -> str:
    """CPU time (not wall time: robust to a shared machine's load) the dashboard's own threads
    and the browser's processes use while tiny tasks run for ``seconds``, per second."""
    import threading

    import psutil

    me = psutil.Process()

    def dash_threads() -> float:
        ids = {t.native_id for t in threading.enumerate()  # the server, the sampler, to_thread
               if t.name.startswith(("shoal-dashboard", "asyncio_"))}
        return sum(t.user_time + t.system_time for t in me.threads() if t.id in ids)

    def chromium_procs() -> float:
        total = 0.0
        for p in me.children(recursive=True):
            try:
                if "chromium" in p.exe():
                    c = p.cpu_times()
                    total += c.user + c.system
            except psutil.Error:
                pass
        return total

    with shoal.Pilot(2, dashboard=0) as pilot:
        page = browser.new_page() if browser is not None else None
        if page is not None:
            page.goto(pilot.dashboard_url + "workers")
            page.wait_for_selector("tr.worker")
        time.sleep(1.0)
        d0, b0, t0 = dash_threads(), chromium_procs(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sum(f.result() for f in [pilot.submit(bench_run.inc, i) for i in range(n_tiny)])
        wall = time.perf_counter() - t0
        d1, b1 = dash_threads(), chromium_procs()
        if page is not None:
            page.close()
    return (f"CPU while tiny tasks ran {wall:.1f} s: the dashboard's threads in the driver "
            f"{1000 * (d1 - d0) / wall:.1f} ms/s ({100 * (d1 - d0) / wall / 2:.2f}% of 2 CPUs); "
            f"the browser's processes {1000 * (b1 - b0) / wall:.1f} ms/s "
            f"({100 * (b1 - b0) / wall / 2:.2f}% of 2 CPUs)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--tiny", type=int, default=20_000)
    ap.add_argument("--uts", default="T3S", help="UTS preset (run.py uses T3; T3S is ~4x smaller)")
    ap.add_argument("--no-browser", action="store_true", help="serve the dashboard, open no page")
    args = ap.parse_args(argv)
    params = uts.UTSParams.preset(args.uts)
    known = uts.DERIVED.get(params.name) or uts.PUBLISHED.get(params.name)
    expect = known.nodes if known else uts.count_sequential(params)
    load0 = os.getloadavg()
    print(f"command: python benchmarks/bench_dashboard.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"machine: {bench_run.machine()}")
    print(f"tiny: {args.tiny} submits; uts: {params.name} ({expect:,} nodes); 2 workers; "
          f"B = dashboard open{'' if not args.no_browser else ' (no browser)'}", flush=True)
    ratios: dict[str, list[float]] = {"tiny": [], "uts": [], "tiny cpu": [], "uts cpu": []}
    with chromium(not args.no_browser) as browser:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {mode: measure(mode, browser, args.tiny, params, expect) for mode in order}
            for k in ratios:
                ratios[k].append(got[True][k] / got[False][k])
            print(f"pair {i + 1}: " + "  ".join(
                f"{k} closed {got[False][k]:.3f} s open {got[True][k]:.3f} s "
                f"(x{got[True][k] / got[False][k]:.3f})" for k in ratios)
                + f"  load {os.getloadavg()[0]:.2f}", flush=True)
        print(cpu_accounting(browser, args.tiny), flush=True)
    print()
    for k, r in ratios.items():
        print(f"{k}: open / closed median {statistics.median(r):.3f}  "
              f"(min {min(r):.3f}, max {max(r):.3f}, {len(r)} pairs)")
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
