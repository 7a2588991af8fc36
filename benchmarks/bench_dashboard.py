"""The dashboard's cost to the pilot: many viewers (default), and one page open (``--overhead``).

Usage::

    python benchmarks/bench_dashboard.py [--clients 200] [--rounds 3] [--seconds 8]
    python benchmarks/bench_dashboard.py --overhead [--pairs 6] [--tiny 20000] [--uts T3S] [--no-browser]

**Viewers** (the default): one 2-worker pilot with ``dashboard=0`` and a progress board
of 3 topics x 240 records (a ~100 KB state, as a training run or a search publishes),
its tiny-task rate (``inc(x)`` submits, one future each, for ``--seconds``) in three
phases per round, in rotating order: *alone* (served, nobody watching), *reading*
(``--clients`` server-sent-event streams read by a separate process), *stalled*
(``--clients`` connections that request ``/events`` and never read a byte; one that the
server drops reconnects, so the pressure stays).  Clients ask for gzip as browsers do
(``--plain``: they do not, and get the uncompressed stream).  Reported per round: the rate, its
ratio to the round's *alone*, the CPU time of the driver and its workers per task (far
less sensitive to other users' load than the rate) and its ratio, the CPU of the
dashboard's threads and of the client process, the driver's resident memory (peak
during the phase minus before it), samples encoded, streams dropped, bytes the readers
got, and how long ``/api/state`` took meanwhile.  The machine's load and its 2-process ceiling
(benchmarks/run.py's ``parallel_ceiling``: 2.0 on an idle 2-core machine) are measured
before and after, in the same run.

**Overhead** (``--overhead``): per pair, in A-B / B-A order (so drift in the machine's
load hits both alike): a fresh 2-worker pilot without a dashboard (A), and one with ``dashboard=0`` and its workers
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


def dashboard_threads_cpu() -> float:
    """CPU seconds of this process's dashboard threads: the server, the sampler, to_thread's."""
    import threading

    import psutil

    ids = {t.native_id for t in threading.enumerate()
           if t.name.startswith(("shoal-dashboard", "asyncio_"))}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def cpu_accounting(browser, n_tiny: int, seconds: float = 10.0) -> str:
    """CPU time (not wall time: robust to a shared machine's load) the dashboard's own threads
    and the browser's processes use while tiny tasks run for ``seconds``, per second."""

    import psutil

    me = psutil.Process()
    dash_threads = dashboard_threads_cpu

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


# -- viewers: many event streams, reading or stalled ------------------------------------------
READY = "clients ready"


def run_clients(url: str, n: int, mode: str, gzip: bool) -> int:
    """The client process: ``n`` /events streams on ``url``, read (``reading``) or never read
    (``stalled``); one the server closes is opened again.  ``gzip``: ask for it, as every
    browser does (then ``events`` is not counted: the bytes are compressed).  Prints READY
    once all are open, and on SIGTERM one JSON line of totals."""
    import json
    import selectors
    import signal
    import socket
    import struct
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    request = (f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{parts.port}\r\n"
               "Accept: text/event-stream\r\n"
               + ("Accept-Encoding: gzip, deflate, br\r\n" if gzip else "") + "\r\n").encode()
    sel = selectors.DefaultSelector()
    totals = {"bytes": 0, "events": 0, "reconnects": 0, "refused": 0}

    def open_one() -> socket.socket:
        sock = socket.create_connection((parts.hostname, parts.port))
        sock.sendall(request)
        sock.setblocking(False)
        if mode == "reading":
            sel.register(sock, selectors.EVENT_READ)
        return sock

    socks = [open_one() for _ in range(n)]
    print(READY, flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    buf = bytearray(1 << 20)
    while not stop:
        if mode == "reading":
            for key, _ in sel.select(0.5):
                sock = key.fileobj
                try:
                    got = sock.recv_into(buf)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    got = 0
                if got:
                    totals["bytes"] += got
                    totals["events"] += bytes(buf[:got]).count(b"data: {\"pages\"")
                    continue
                sel.unregister(sock)
                sock.close()
                socks.remove(sock)
                totals["reconnects"] += 1
                socks.append(open_one())
        else:  # stalled: never read; look at the TCP state to see the server drop one
            time.sleep(0.5)
            for i, sock in enumerate(socks):
                state = struct.unpack("B", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1))[0]
                if state != 1:  # not ESTABLISHED: the server closed it
                    sock.close()
                    totals["reconnects"] += 1
                    socks[i] = open_one()
    print(json.dumps(totals), flush=True)
    return 0


def publish_board(topics: int = 3, records: int = 240) -> None:
    """A progress board like a long run's: ``topics`` x ``records`` of 8 numeric fields."""
    for t in range(topics):
        for i in range(records):
            shoal.publish(f"bench{t}", step=i, loss=1.0 / (i + 1), accuracy=i / records,
                          samples=i * 512, seconds=0.25 * i, samples_per_s=2048.5 + i,
                          lr=0.001, epoch=i // 24)


def viewers_phase(pilot, mode: str, clients: int, seconds: float, batch: int, gzip: bool) -> dict:
    """The tiny-task rate for ``seconds`` with ``clients`` streams ``mode`` (or ``alone``)."""
    import json
    import subprocess
    import urllib.request

    import psutil

    me = psutil.Process()
    bc = pilot._dashboard.app.state.broadcaster  # the benchmark looks inside; users need not
    proc = None
    rss0 = me.memory_info().rss
    enc0, drops0 = bc.encodings, bc.drops
    if mode != "alone":
        proc = subprocess.Popen([sys.executable, __file__, "--client", mode, "--url",
                                 pilot.dashboard_url, "--clients", str(clients)]
                                + ([] if gzip else ["--plain"]),
                                stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline().strip()
        if line != READY:
            raise RuntimeError(f"client process said {line!r}")
        time.sleep(1.0)
    peak = me.memory_info().rss
    api_s: list[float] = []
    cpu0, work0 = dashboard_threads_cpu(), _cpu_s()
    client0 = sum(psutil.Process(proc.pid).cpu_times()[:2]) if proc is not None else 0.0
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        got = sum(f.result() for f in [pilot.submit(bench_run.inc, i) for i in range(batch)])
        if got != batch * (batch + 1) // 2:
            raise AssertionError(f"wrong result {got}")
        done += batch
        peak = max(peak, me.memory_info().rss)
        if len(api_s) < 3 and time.perf_counter() - t0 > seconds * (len(api_s) + 1) / 4:
            a0 = time.perf_counter()
            with urllib.request.urlopen(pilot.dashboard_url + "api/state", timeout=60) as r:
                r.read()
            api_s.append(time.perf_counter() - a0)
    wall = time.perf_counter() - t0
    cpu, work = dashboard_threads_cpu() - cpu0, _cpu_s() - work0
    client = sum(psutil.Process(proc.pid).cpu_times()[:2]) - client0 if proc is not None else 0.0
    totals = {}
    if proc is not None:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
        totals = json.loads(out.strip().splitlines()[-1])
    return {"rate": done / wall, "rss_mib": (peak - rss0) / 2**20, "encodings": bc.encodings - enc0,
            "drops": bc.drops - drops0, "api_s": max(api_s) if api_s else float("nan"),
            "server_ms_s": 1000 * cpu / wall, "cpu_us_task": 1e6 * work / done, "client_ms_s": 1000 * client / wall, **totals,
            "wall": wall}


def viewers(args) -> int:
    load0 = os.getloadavg()
    ceil0 = bench_run.parallel_ceiling()
    print(f"command: python benchmarks/bench_dashboard.py {' '.join(sys.argv[1:])}")
    print(f"machine: {bench_run.machine()}")
    print(f"2-process ceiling before: {ceil0:.2f} (2.00 = two idle cores)", flush=True)
    modes = ["alone"] + [m for m in ("reading", "stalled") if m in args.modes.split(",")]
    ratios: dict[str, list[float]] = {m: [] for m in modes[1:]}
    cpu_ratios: dict[str, list[float]] = {m: [] for m in modes[1:]}
    mem: dict[str, list[float]] = {m: [] for m in modes}
    publish_board()
    with shoal.Pilot(2, dashboard=0) as pilot:
        list(pilot.map(bench_run.inc, range(64)))
        time.sleep(1.5)  # the sampler has run
        import urllib.request

        with urllib.request.urlopen(pilot.dashboard_url + "api/state", timeout=60) as resp:
            size = len(resp.read())
        gz = len(pilot._dashboard.app.state.broadcaster.frames()[1])
        print(f"state: {size / 1024:.0f} KiB a sample ({gz / 1024:.0f} KiB gzipped); {args.clients} clients"
              f"{' (plain: no gzip)' if args.plain else ' asking for gzip, as browsers do'}; {args.seconds:g} s "
              f"of tiny tasks (batches of {args.batch}) per phase", flush=True)
        for _ in range(2):  # warm: the first batches' allocations are not the clients'
            sum(f.result() for f in [pilot.submit(bench_run.inc, i) for i in range(args.batch)])
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            got = {}
            for mode in order:
                got[mode] = viewers_phase(pilot, mode, args.clients, args.seconds, args.batch,
                                          not args.plain)
                g = got[mode]
                print(f"round {r + 1} {mode:<8} {g['rate']:>9,.0f} tasks/s  driver RSS +{g['rss_mib']:.1f} MiB"
                      f"  encoded {g['encodings']}  dropped {g['drops']}  /api/state {g['api_s']:.3f} s"
                      + (f"  clients got {g.get('bytes', 0) / 2**20:.1f} MiB"
                         + ("" if not args.plain else f", {g.get('events', 0)} samples")
                         + f", reconnected {g.get('reconnects', 0)}" if mode != "alone" else "")
                      + f"  CPU: {g['cpu_us_task']:.0f} us/task (driver + workers), dashboard threads"
                        f" {g['server_ms_s']:.0f} ms/s, clients "
                        f"{g['client_ms_s']:.0f} ms/s  load {os.getloadavg()[0]:.2f}", flush=True)
                mem[mode].append(g["rss_mib"])
                time.sleep(2.0)  # dropped and closed streams settle before the next phase
            for m in ratios:
                ratios[m].append(got[m]["rate"] / got["alone"]["rate"])
                cpu_ratios[m].append(got[m]["cpu_us_task"] / got["alone"]["cpu_us_task"])
    print()
    for m, rs in ratios.items():
        print(f"{m}: tiny-task rate / alone median {statistics.median(rs):.3f} (min {min(rs):.3f}, "
              f"max {max(rs):.3f}, {len(rs)} rounds); CPU per task / alone median "
              f"{statistics.median(cpu_ratios[m]):.3f} (min {min(cpu_ratios[m]):.3f}, max "
              f"{max(cpu_ratios[m]):.3f}); driver RSS growth max {max(mem[m]):.1f} MiB")
    load1 = os.getloadavg()
    ceil1 = bench_run.parallel_ceiling()
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; 2-process ceiling before "
          f"{ceil0:.2f}, after {ceil1:.2f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--overhead", action="store_true", help="one page open vs closed (A/B pairs)")
    ap.add_argument("--clients", type=int, default=200, help="viewers: event streams per phase")
    ap.add_argument("--rounds", type=int, default=3, help="viewers: rounds of the three phases")
    ap.add_argument("--seconds", type=float, default=8.0, help="viewers: tiny tasks per phase, s")
    ap.add_argument("--batch", type=int, default=5000, help="viewers: submits per batch")
    ap.add_argument("--plain", action="store_true", help="viewers: clients do not ask for gzip")
    ap.add_argument("--modes", default="reading,stalled",
                    help="viewers: phases beside 'alone' (e.g. stalled with --seconds 90: long "
                         "enough for the kernel's buffers to fill and the drops to happen)")
    ap.add_argument("--client", choices=["reading", "stalled"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--tiny", type=int, default=20_000)
    ap.add_argument("--uts", default="T3S", help="UTS preset (run.py uses T3; T3S is ~4x smaller)")
    ap.add_argument("--no-browser", action="store_true", help="serve the dashboard, open no page")
    args = ap.parse_args(argv)
    if args.client:
        return run_clients(args.url, args.clients, args.client, not args.plain)
    if not args.overhead:
        return viewers(args)
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
