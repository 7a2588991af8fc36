"""An elastic pilot through a burst on a real SLURM: jobs over time, decisions, tasks run once.

Usage (needs a SLURM: ``sudo scripts/slurm-local up``)::

    python benchmarks/bench_slurm_elastic.py [--tasks 40] [--seconds 5] [--jobs 1:3]
        [--grow-after 2] [--idle-after 10]

Submits ``--tasks`` tasks of ``--seconds`` each (sleeps, 1 core per job) to
``Pilot(provider="slurm", jobs=...)`` at once, samples every second the jobs the pilot asks
for and the ones SLURM runs, waits until it is back at its minimum, closes it, and prints
the timeline, each decision with its reason, how many times each task ran (from a ledger
file each run appends to), and whether squeue still lists any of its jobs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time


def ledger(x: int, path: str, seconds: float):
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"{x} {os.environ.get('SLURM_JOB_ID')}\n")
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--jobs", default="1:3")
    ap.add_argument("--grow-after", type=float, default=2.0)
    ap.add_argument("--idle-after", type=float, default=10.0)
    args = ap.parse_args()
    import shoal

    tmp = tempfile.mkdtemp(prefix="shoal-elastic-")
    path = os.path.join(tmp, "ledger")
    rows: list[tuple[float, int, int]] = []
    stop = threading.Event()
    t0 = time.monotonic()
    with shoal.Pilot(backend="dask", provider="slurm", jobs=args.jobs, cores=1, memory="1GB",
                     walltime="30m", grow_after_s=args.grow_after, idle_after_s=args.idle_after,
                     log_directory=tmp, scheduler_options={"dashboard_address": ":0"}) as p:
        def sample():
            while not stop.wait(1.0):
                d = p.stats()["driver"]
                rows.append((time.monotonic() - t0, d["elastic"]["jobs"],
                             sum(j["state"] == "RUNNING" for j in d["jobs"])))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        futs = [p.submit(ledger, i, path, args.seconds) for i in range(args.tasks)]
        for f in futs:
            f.result(3600)
        burst_s = time.monotonic() - t0
        low = int(str(args.jobs).split(":")[0])
        while p.stats()["driver"]["elastic"]["jobs"] > low and time.monotonic() - t0 < burst_s + 300:
            time.sleep(0.5)
        time.sleep(2)
        stop.set()
        sampler.join()
        elastic = p.stats()["driver"]["elastic"]
        ids = {j["job_id"] for j in p.stats()["driver"]["jobs"]} | {
            d["job_id"] for d in elastic["decisions"] if d["job_id"]}
    ran = [int(line.split()[0]) for line in open(path)]
    left = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    last = None
    print("t_s  asked  running   (changes only)")
    for t, asked, running in rows:
        if (asked, running) != last:
            print(f"{t:5.0f}  {asked:5d}  {running:7d}")
            last = (asked, running)
    print(f"burst done at {burst_s:.0f} s; peak {elastic['peak']} jobs")
    for d in elastic["decisions"]:
        print(f"{time.strftime('%H:%M:%S', time.localtime(d['t']))} {d['action']:<6} "
              f"{d['job_id'] or '':<6} {d['reason']}")
    once = sorted(ran) == list(range(args.tasks))
    print(f"tasks run: {len(ran)} lines for {args.tasks} tasks, each exactly once: {once}")
    print(f"pilot jobs still in squeue after close: {sorted(ids & set(left)) or 'none'}")
    return 0 if once and not (ids & set(left)) else 1


if __name__ == "__main__":
    sys.exit(main())
