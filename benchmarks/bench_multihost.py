"""Overheads across hosts (scripts/testbed): a task that crosses to another host vs one that
stays on the driver's, the balancer on UTS over 3 hosts vs 3 workers on one host, and the time
from a host's crash to the last future settling.

    sudo scripts/testbed up --hosts 3 --dask
    sudo python benchmarks/bench_multihost.py [--tasks 400] [--uts T3]

The hosts share this machine's cores, so these are costs, not speed-ups.  "crosses": the
test bed's dask cluster (one worker per host, reached over the bridge); "stays": a dask
scheduler and 3 workers started here on 127.0.0.1 (same code, no namespace crossing).
Prints the load and the 2-process ceiling (two CPU-bound processes at once vs one, measured
in the same run: what "2 cores" gives at this moment).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "multihost")]

import shoal  # noqa: E402


def spin(n=3_000_000):
    x = 0
    for i in range(n):
        x += i
    return x


def ceiling() -> float:
    """Throughput of 2 CPU-bound processes at once over 1 (2.0: two free cores)."""
    t0 = time.perf_counter()
    spin()
    one = time.perf_counter() - t0
    with mp.get_context("spawn").Pool(2) as pool:
        t0 = time.perf_counter()
        pool.map(spin, [3_000_000, 3_000_000])
        two = time.perf_counter() - t0
    return 2 * one / two


def inc(x):
    return x + 1


def measure(address: str, n: int) -> tuple[float, float]:
    """(median round-trip latency in ms of one submit, tasks/s of n submits)."""
    with shoal.Pilot(backend="dask", address=address, workers=1) as p:
        list(p.map(inc, range(50)))  # warm
        lat = []
        for i in range(30):
            t0 = time.perf_counter()
            p.submit(inc, i).result(60)
            lat.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert [f.result(120) for f in [p.submit(inc, i) for i in range(n)]] == list(range(1, n + 1))
        rate = n / (time.perf_counter() - t0)
    lat.sort()
    return 1000 * lat[len(lat) // 2], rate


KNOWN_SIZES = {"T3": 4_112_897}  # the UTS benchmark's published tree sizes


def uts_balance(address: str, tree: str) -> tuple[float, int, float]:
    """UTS ``tree`` counted on the dask pilot at ``address`` (one shoal worker per dask
    worker): (seconds, tasks the balancer moved between dask workers, share of the shoal
    workers' time spent idle waiting for work).  The count is checked against the
    sequential one."""
    from shoal.workloads import uts

    params = getattr(uts, tree)
    with shoal.Pilot(backend="dask", address=address, workers=1) as p:
        uts.count_parallel(p, uts.T1XS)  # warm: every node runtime started
        idle0 = _idle_s(p)
        moved0 = p.stats()["driver"]["moved"]
        t0 = time.perf_counter()
        got = uts.count_parallel(p, params)
        wall = time.perf_counter() - t0
        st = p.stats()
        moved = st["driver"]["moved"] - moved0
        idle = (_idle_s(p, st) - idle0) / (len(st["workers"]) * wall)
    want = KNOWN_SIZES.get(tree) or uts.count_sequential(params)
    if got != want:
        raise SystemExit(f"UTS {tree}: counted {got:,}, the tree has {want:,} nodes")
    return wall, moved, idle


def _idle_s(pilot, stats=None) -> float:
    """Seconds the pilot's shoal workers have waited for work so far, all together."""
    return sum(w.get("idle_s", 0.0) for w in (stats or pilot.stats())["workers"])


def crash_to_settled(address: str, script: str) -> float:
    """Crash h3 while 30 0.2-s tasks are out; seconds until the last future settles."""
    import mh_tasks as mt

    with shoal.Pilot(backend="dask", address=address, workers=1) as p:
        futs = [p.submit(mt.echo, b"x", 0.2) for _ in range(30)]
        time.sleep(0.5)
        t0 = time.perf_counter()
        subprocess.run([script, "crash", "h3"], check=True, capture_output=True)
        for f in futs:
            f.result(300)
        took = time.perf_counter() - t0
    subprocess.run([script, "up"], check=True, capture_output=True)
    return took


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--uts", default="T3", help="the UTS tree of the balancer row (default T3)")
    args = ap.parse_args(argv)
    from testbed_helpers import SCRIPT, read_env

    bed = read_env()
    if bed is None or not bed.dask:
        sys.exit("no test bed with dask is up: sudo scripts/testbed up --hosts 3 --dask")
    from dask_cluster import CliCluster

    print(f"load average {os.getloadavg()[0]:.1f}, 2-process ceiling {ceiling():.2f}x "
          f"({os.cpu_count()} CPUs)", flush=True)
    local = CliCluster(3)
    try:
        stay = measure(local.address, args.tasks)
        uts_stay = uts_balance(local.address, args.uts)
    finally:
        local.close()
    cross = measure(bed.dask, args.tasks)
    uts_cross = uts_balance(bed.dask, args.uts)
    print("| path | submit round trip (median ms) | tasks/s |\n|---|---|---|")
    print(f"| stays (3 workers on 127.0.0.1) | {stay[0]:.1f} | {stay[1]:.0f} |")
    print(f"| crosses (3 test-bed hosts) | {cross[0]:.1f} | {cross[1]:.0f} |")
    print(f"ratio crosses/stays: latency {cross[0] / stay[0]:.2f}x, rate {cross[1] / stay[1]:.2f}x")
    print(f"\n| UTS {args.uts} on 3 dask workers | seconds | tasks moved by the balancer | "
          "shoal workers idle |\n|---|---|---|---|")
    for name, (wall, moved, idle) in (("one host (127.0.0.1)", uts_stay),
                                      ("3 test-bed hosts", uts_cross)):
        print(f"| {name} | {wall:.2f} | {moved} | {idle:.0%} |")
    print(f"crash h3 with 30 tasks out -> last future settled: "
          f"{crash_to_settled(bed.dask, SCRIPT):.2f} s")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
