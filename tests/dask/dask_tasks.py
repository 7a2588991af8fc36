"""Task functions for the dask backend tests (module-level: dask workers and shoal workers
import them by name; the test clusters put this directory on their PYTHONPATH)."""

from __future__ import annotations

import os
import signal
import time

import shoal


def inc(x):
    return x + 1


def add(a, b=0):
    return a + b


def total(xs):
    return sum(xs)


def mapping_sum(d):
    return sum(d.values())


def boom(msg="boom"):
    raise ValueError(msg)


def sleep(s):
    time.sleep(s)
    return s


def fail_until(marker, n):
    """Raise until called n times (counts in a file)."""
    count = int(open(marker).read()) if os.path.exists(marker) else 0
    with open(marker, "w") as f:
        f.write(str(count + 1))
    if count + 1 < n:
        raise RuntimeError(f"attempt {count + 1}")
    return count + 1


def sfib(n):
    return n if n < 2 else sfib(n - 1) + sfib(n - 2)


def fib(n, cutoff=12):
    if n < cutoff:
        return sfib(n)
    a = shoal.spawn(fib, n - 1, cutoff)
    b = fib(n - 2, cutoff)
    return a.result() + b


def chain(depth):
    """A path of nested tasks, each joining its only child."""
    if depth == 0:
        return 0
    return shoal.spawn(chain, depth - 1).result() + 1


def where():
    w = shoal.current_worker()
    return (w.id, w.pid, os.getppid()) if w else None


def die_node_worker():
    """SIGKILL the shoal worker running this task (the node runtime reports WorkerLost)."""
    os.kill(os.getpid(), signal.SIGKILL)


def kill_dask_worker():
    """SIGKILL the dask worker process hosting this task's node runtime."""
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(30)


def slow_item(x, s=0.01):
    time.sleep(s)
    return x * x


def slow_leaf_tree(depth, fanout, leaf_s):
    if depth == 0:
        time.sleep(leaf_s)
        return 1
    kids = [shoal.spawn(slow_leaf_tree, depth - 1, fanout, leaf_s) for _ in range(fanout)]
    return 1 + sum(k.result() for k in kids)


def slow_tree_reporting(depth, fanout, leaf_s, pidfile):
    """slow_leaf_tree; first writes 'shoal worker pid, dask worker pid' to pidfile (once)."""
    if not os.path.exists(pidfile):
        with open(pidfile + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        os.replace(pidfile + ".tmp", pidfile)
    return slow_leaf_tree(depth, fanout, leaf_s)


def fill_slices(arr, parts):
    """Spawn one child per slice of ``arr`` (a SharedArray: this machine's memory, so the
    children must stay on this node); each writes its slice after some work."""
    n = arr.shape[0] // parts
    futs = [shoal.spawn(fill_one, arr, i * n, (i + 1) * n) for i in range(parts)]
    return sum(f.result() for f in futs)


def fill_one(arr, lo, hi):
    sfib(18)
    arr.array[lo:hi] = range(lo, hi)
    return hi - lo
