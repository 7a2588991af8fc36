"""A pilot job's start-up on a real SLURM: submit to first result, next to SLURM's own round trip.

Usage (needs a SLURM: ``sudo scripts/slurm-local up``)::

    python benchmarks/bench_slurm.py [--repeat 5]

Measured in one run, interleaved, ``--repeat`` times each (median and best printed):

* ``sbatch --wait --wrap true``: SLURM's own submit -> job ends round trip, the floor
  any batch pilot pays (scheduler cycle, slurmd launching the batch step);
* ``shoal.Pilot(backend="dask", provider="slurm", cores=1)`` constructed, then one
  ``submit(...).result()``: sbatch --test-only, the job through the queue, the dask
  worker's start inside it, shoal's node runtime, the task (that is, from the user's call
  to the first result; ``close()`` is outside the time);
* ``close()`` of that pilot until squeue no longer lists its job.

Ratios to the sbatch round trip are what to read: the machine is small and shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def sbatch_roundtrip(tmp: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["sbatch", "--wait", "-o", os.devnull, "--wrap", "true"], cwd=tmp, check=True,
                   capture_output=True)
    return time.perf_counter() - t0


def one(_=None) -> str:
    return os.environ.get("SLURM_JOB_ID", "")


def pilot_first_result(tmp: str) -> tuple[float, float]:
    import shoal

    t0 = time.perf_counter()
    p = shoal.Pilot(backend="dask", provider="slurm", cores=1, memory="1GB", walltime="5m",
                    log_directory=tmp, scheduler_options={"dashboard_address": ":0"})
    job = p.submit(one).result(300)
    first = time.perf_counter() - t0
    assert job, "the task did not run in a SLURM job"
    t1 = time.perf_counter()
    p.close()
    return first, time.perf_counter() - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)
    rows = {"sbatch --wait --wrap true": [], "pilot: submit -> first result": [],
            "pilot: close -> squeue empty": []}
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        for _ in range(args.repeat):
            rows["sbatch --wait --wrap true"].append(sbatch_roundtrip(tmp))
            first, close = pilot_first_result(tmp)
            rows["pilot: submit -> first result"].append(first)
            rows["pilot: close -> squeue empty"].append(close)
    base = statistics.median(rows["sbatch --wait --wrap true"])
    print(f"load: {open('/proc/loadavg').read().split()[:3]}  cores: {os.cpu_count()}")
    print(f"{'what':34} {'median s':>9} {'best s':>8} {'x sbatch':>9}")
    for name, ts in rows.items():
        med = statistics.median(ts)
        print(f"{name:34} {med:9.2f} {min(ts):8.2f} {med / base:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
