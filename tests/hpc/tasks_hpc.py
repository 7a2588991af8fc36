"""Task functions for the SLURM tests (importable by the dask workers inside the jobs)."""

from __future__ import annotations

import os
import time

import shoal


def where(x=None, delay: float = 0.0):
    """(x, the SLURM job this runs in, CPUs the job has here, shoal workers of this node)."""
    if delay:
        time.sleep(delay)
    w = shoal.current_worker()
    return x, os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_CPUS_ON_NODE"), \
        (w.workers if w else None)


def ledger(x, path: str, delay: float = 0.0):
    """Sleep ``delay``, then append 'x job-id' to ``path`` (a run counts once per line)."""
    if delay:
        time.sleep(delay)
    job = os.environ.get("SLURM_JOB_ID")
    with open(path, "a") as f:
        f.write(f"{x} {job}\n")
    return x, job
