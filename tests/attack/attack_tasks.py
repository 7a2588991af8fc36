"""Task functions of tests/attack (importable by dask worker processes: the CLI cluster
and LocalCluster put tests/ on the path through tests/dask_cluster.py or pytest)."""

from __future__ import annotations

import os
import time


def wait_flag(flag, limit_s: float = 30.0) -> str:
    """Wait until ``flag`` (a BestCell.for_pilot) rises: "stopped" or "timeout"."""
    end = time.monotonic() + limit_s
    while flag.value <= 0:
        if time.monotonic() > end:
            return "timeout"
        time.sleep(0.002)
    return "stopped"


def touch_all(objs) -> int:
    """Arrive with many pilot-level handles (each becomes a replica on this node)."""
    return len(objs)


def improve_then_wait(best, flag, value: float, path: str, limit_s: float = 30.0):
    """Offer ``value`` to ``best``, record where it ran (O_APPEND), wait for ``flag``;
    return (what it saw, best's value then, this dask worker's pid)."""
    best.offer(value)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"%r %d\n" % (value, os.getppid()))
    finally:
        os.close(fd)
    said = wait_flag(flag, limit_s)
    return said, best.value


def improvers(best, flag, n: int, path: str) -> list:
    """A user's spawn program: ``n`` leaves that each offer 10+i and wait for ``flag``."""
    import shoal

    futs = [shoal.spawn(improve_then_wait, best, flag, 10.0 + i, path) for i in range(n)]
    return [f.result() for f in futs]
