"""Overheads across hosts (scripts/testbed): a task that crosses to another host vs one that
stays on the driver's, and the time from a host's crash to the last future settling.

    sudo scripts/testbed up --hosts 3 --dask
    sudo python benchmarks/bench_multihost.py [--tasks 400]

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
    finally:
        local.close()
    cross = measure(bed.dask, args.tasks)
    print("| path | submit round trip (median ms) | tasks/s |\n|---|---|---|")
    print(f"| stays (3 workers on 127.0.0.1) | {stay[0]:.1f} | {stay[1]:.0f} |")
    print(f"| crosses (3 test-bed hosts) | {cross[0]:.1f} | {cross[1]:.0f} |")
    print(f"ratio crosses/stays: latency {cross[0] / stay[0]:.2f}x, rate {cross[1] / stay[1]:.2f}x")
    print(f"crash h3 with 30 tasks out -> last future settled: "
          f"{crash_to_settled(bed.dask, SCRIPT):.2f} s")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
