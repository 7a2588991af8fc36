"""Ensemble throughput, one run, ratios: ``python benchmarks/bench_ensemble.py [--tasks 512]``.

1. N ``/bin/true`` executables on this machine's cores: shoal.ensemble (journal
   on) vs ``xargs -P<cores>`` vs a plain ``subprocess.run`` loop; also the time
   from ``run()`` to the first task's start.
2. M tiny function tasks (default 100,000, generated lazily) through the
   ensemble API: tasks/s (untraced run) and the peak traced driver memory
   (a second run under tracemalloc).  About a minute on 2 cores; ``--functions
   10000`` for a quick look.

For context: RADICAL-EnTK 1.103 ran 512 ``/bin/true`` tasks on a 2-core
machine in ~155 s (~3 tasks/s).  Quote ratios; the machines are small and noisy.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shoal.ensemble import Pipeline, Stage, Task, run  # noqa: E402


def tiny(i):
    return i + 1


def bench_true(n: int, cores: int, tmp: str) -> dict:
    rows = {}
    t = time.perf_counter()
    subprocess.run(f"seq {n} | xargs -n1 -P{cores} /bin/true", shell=True, check=True)
    rows["xargs"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(n):
        subprocess.run(["/bin/true"], check=True)
    rows["subprocess loop"] = n / (time.perf_counter() - t)
    journal = os.path.join(tmp, "true.db")
    t = time.perf_counter()
    t_wall = time.time()
    report = run(Pipeline([Stage([Task(executable="/bin/true") for _ in range(n)])]), journal=journal,
                 cores=cores)
    elapsed = time.perf_counter() - t
    assert report.ok and report.done == n, report
    db = sqlite3.connect(journal)
    first = db.execute("SELECT min(started) FROM tasks").fetchone()[0]
    db.close()
    rows["shoal.ensemble"] = n / elapsed
    rows["first_task_s"] = first - t_wall
    return rows


def bench_functions(m: int, tmp: str) -> dict:
    def lazy():
        for i in range(m):
            yield Task(function=tiny, args=(i,))

    t = time.perf_counter()
    report = run(Pipeline([Stage(lazy())]), journal=os.path.join(tmp, "fn.db"))
    rate = m / (time.perf_counter() - t)
    assert report.done == m
    tracemalloc.start()
    run(Pipeline([Stage(lazy())]), journal=os.path.join(tmp, "fn2.db"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"rate": rate, "peak_bytes": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=512)
    ap.add_argument("--functions", type=int, default=100_000)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_true(args.tasks, args.cores, tmp)
        print(f"{args.tasks} x /bin/true on {args.cores} cores (journal on):")
        xargs = rows["xargs"]
        for name in ("xargs", "subprocess loop", "shoal.ensemble"):
            print(f"  {name:<16} {rows[name]:8.0f} tasks/s   {rows[name] / xargs:5.2f}x xargs")
        print(f"  EnTK 1.103 (measured earlier, 2 cores): ~3 tasks/s = {3 / xargs:.3f}x xargs")
        print(f"  run() to first task start: {rows['first_task_s'] * 1000:.0f} ms")
        fn = bench_functions(args.functions, tmp)
        print(f"{args.functions} function tasks through the ensemble API: {fn['rate']:.0f} tasks/s, "
              f"peak traced driver memory {fn['peak_bytes'] / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
