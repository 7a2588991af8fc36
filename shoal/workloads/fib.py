"""Fibonacci by naive recursion: the fork-join microbenchmark, and spawn overhead.

``fib(n) = fib(n-1) + fib(n-2)`` computed the exponential way is the "hello
world" of task-parallel runtimes (Cilk, TBB, rayon, Lace): all overhead, no
data.  Here it measures two things:

* ``fib_parallel(pilot, n, cutoff)``: a spawn per call above ``cutoff``,
  sequential below.  The parent spawns ``fib(n-1)`` and computes ``fib(n-2)``
  itself (work first), so with one worker the spawned child is still on the
  deque when the parent joins, and the join runs it in place.  The speed-up
  against ``fib_sequential`` in the same process, per worker count, shows what
  the runtime's task machinery costs at a given granularity
  (``fib_sequential(20)`` is ~0.7 ms of CPython 3.11, ``fib_sequential(22)`` ~1.8 ms).
* ``empty_tree(pilot, n)``: one task spawns ``n`` children that do nothing and
  joins them; ``(time - baseline) / n`` is the cost of one spawn + run + join of
  a nested task on a worker (the benchmark runner reports it in microseconds).

Spawn depth is ``n - cutoff`` nested joins at most, far below the recursion
limit for any ``n`` whose answer finishes in reasonable time.
Only shoal's public API is used.
"""

from __future__ import annotations

import shoal

__all__ = ["DEFAULT_CUTOFF", "empty_tree", "fib_frontier", "fib_parallel",
           "fib_sequential", "fib_value"]

DEFAULT_CUTOFF = 22  # fib_sequential(21) is ~1 ms of CPython: tasks of a millisecond and up


def fib_sequential(n: int) -> int:
    """fib(n) by naive recursion (fib(0) = 0, fib(1) = 1): exponential on purpose."""
    if n < 2:
        return n
    return fib_sequential(n - 1) + fib_sequential(n - 2)


def fib_value(n: int) -> int:
    """fib(n) in linear time: the reference the recursive versions are checked against."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _fib_task(n: int, cutoff: int) -> int:
    if n < cutoff or n < 2:
        return fib_sequential(n)
    a = shoal.spawn(_fib_task, n - 1, cutoff)
    b = _fib_task(n - 2, cutoff)
    return a.result() + b


def fib_parallel(pilot, n: int, cutoff: int = DEFAULT_CUTOFF) -> int:
    """fib(n) with ``pilot``'s workers: a task per call with ``n >= cutoff``."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return pilot.submit(_fib_task, n, max(cutoff, 2)).result()


def fib_frontier(n: int, cutoff: int = DEFAULT_CUTOFF) -> list[int]:
    """The leaves of the recursion at ``cutoff``: ``sum(map(fib_sequential, ...)) == fib(n)``.

    Static decomposition for peers without nested tasks (multiprocessing.Pool,
    dask): the same sequential leaves as ``fib_parallel``, all known up front.
    """
    out, stack = [], [n]
    while stack:
        k = stack.pop()
        if k < cutoff or k < 2:
            out.append(k)
        else:
            stack.extend((k - 1, k - 2))
    return out


def _nothing() -> None:
    return None


def _spawn_empty(n: int) -> int:
    futs = [shoal.spawn(_nothing) for _ in range(n)]
    for f in reversed(futs):
        f.result()
    return n


def empty_tree(pilot, n: int) -> int:
    """Spawn ``n`` empty children from one task and join them; returns ``n``.

    For the per-task overhead of nested spawns: time it, subtract
    ``empty_tree(pilot, 0)``, divide by ``n``.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    return pilot.submit(_spawn_empty, n).result()
