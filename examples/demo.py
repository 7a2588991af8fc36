"""shoal demo: a pilot, a task graph, and the speed-up of work stealing.

    python examples/demo.py [--workers N] [--queens 13]

1. Shows the machine as shoal sees it (CPUs, NUMA nodes).
2. Starts a pilot (one worker process per usable CPU) and times start-up.
3. Runs a small task graph: futures passed as arguments are dependencies.
4. Counts N-Queens solutions sequentially, then in parallel with nested tasks
   (``shoal.spawn``) and work stealing, checks the count against OEIS A000170
   and prints the speed-up.
"""

from __future__ import annotations

import argparse
import time

import shoal
from shoal.workloads import nqueens


def load(name: str) -> list[int]:
    """Pretend to load a data set: a deterministic list of numbers."""
    return [(hash(name) + i * 7919) % 1000 for i in range(50_000)]


def summarize(xs: list[int]) -> dict:
    return {"n": len(xs), "sum": sum(xs), "max": max(xs)}


def merge(*parts: dict) -> dict:
    return {"n": sum(p["n"] for p in parts), "sum": sum(p["sum"] for p in parts),
            "max": max(p["max"] for p in parts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: usable CPUs)")
    ap.add_argument("--queens", type=int, default=13, help="board size for the speed-up run (default 13)")
    args = ap.parse_args()

    topo = shoal.topology()
    print(f"machine: {topo.logical_cpus} logical CPUs, {topo.physical_cores} cores, "
          f"usable {list(topo.usable_cpus)}, NUMA nodes {[list(n.cpus) for n in topo.nodes]}")

    t0 = time.perf_counter()
    with shoal.Pilot(workers=args.workers) as pilot:
        print(f"pilot: {pilot.workers} workers started in {time.perf_counter() - t0:.3f} s")

        # A task graph: three loads, a summary of each, one merge of the summaries.
        t1 = time.perf_counter()
        loads = [pilot.submit(load, f"part-{i}") for i in range(3)]
        sums = [pilot.submit(summarize, part) for part in loads]
        merged = pilot.submit(merge, *sums)
        print(f"task graph: load x3 -> summarize x3 -> merge = {merged.result()} "
              f"({time.perf_counter() - t1:.3f} s)")

        n = args.queens
        print(f"{n}-queens, sequential ...", flush=True)
        t2 = time.perf_counter()
        seq = nqueens.count_sequential(n)
        t_seq = time.perf_counter() - t2
        print(f"{n}-queens, parallel with spawn + work stealing on {pilot.workers} workers ...", flush=True)
        t3 = time.perf_counter()
        par = nqueens.count_parallel(pilot, n)
        t_par = time.perf_counter() - t3
        ref = nqueens.OEIS_A000170[n]
        assert seq == par == ref, (seq, par, ref)
        print(f"{n}-queens: {par} solutions (OEIS A000170: {ref})  sequential {t_seq:.2f} s, "
              f"parallel {t_par:.2f} s, speed-up {t_seq / t_par:.2f}x on {pilot.workers} workers")
        stolen = sum(w["stolen_local"] + w["stolen_remote"] for w in pilot.stats()["workers"])
        print(f"tasks stolen between workers: {stolen}")
    print(f"pilot closed; total {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
