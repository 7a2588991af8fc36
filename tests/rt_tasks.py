"""The task functions of the executor tests, on every backend (module-level, so workers import
them by name: local workers inherit the driver's sys.path, which holds tests/; the dask test
clusters put tests/ on their PYTHONPATH, see tests/dask_cluster.py).

One module for tests/runtime, tests/dask and tests/conformance: a behaviour's task is written
once.  Tasks that must still be running when the test acts block on a file the test creates
(``wait_for``), never on a sleep that is assumed to outlast the test's next step.

Side effects as the reference for "it ran" (the cancel and failure tests): ``mark`` appends
the task's number to a file with ``O_APPEND`` (one whole line per run, from any process),
``ran`` counts the lines, ``until`` waits (bounded) for a condition such as a mark.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import time

import shoal


def append_line(path: str, line: str) -> None:
    """One whole line appended with O_APPEND (one write: safe from any process)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def mark(path: str, i: int) -> int:
    """Append ``i`` to ``path`` (O_APPEND: one write per run, whole lines); ``i`` as the result."""
    append_line(path, str(i))
    return i


def marked_gate(marks: str, name: str, gate: str, timeout: float = 120.0) -> str:
    """Append ``start <name> <pid>`` to ``marks`` (the side effect a test checks), block
    until ``gate`` exists, append ``end <name>``; ``name`` as the result."""
    append_line(marks, f"start {name} {os.getpid()}")
    wait_for(gate, timeout)
    append_line(marks, f"end {name}")
    return name


def ran(path: str) -> collections.Counter:
    """How many times each number was ``mark``ed in ``path`` (empty if nothing ran)."""
    if not os.path.exists(path):
        return collections.Counter()
    with open(path) as f:
        return collections.Counter(int(x) for x in f.read().split())


def until(cond, limit: float = 60.0, what: str = "condition", pause: float = 0.002) -> None:
    """Wait until ``cond()`` is true, polling every ``pause`` s; TimeoutError(``what``)
    after ``limit`` s (a test never waits forever, and never assumes work is slow)."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(pause)


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


def pid():
    return os.getpid()


def wait_for(path, timeout=120.0, value=None, started=None):
    """Block until ``path`` exists (the test creates it to release the task); ``value``, or
    ``path``, as the result.  TimeoutError after ``timeout`` s, so a failed test cannot
    leave the task running forever.  ``started``: a file created first, so the test knows
    the task runs (on every backend; dask's futures do not report RUNNING)."""
    if started is not None:
        release(started)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody created {path}")
        time.sleep(0.005)
    return path if value is None else value


def release(path):
    """Create ``path`` (releases the ``wait_for`` tasks waiting on it); from a test."""
    with open(path + ".tmp", "w"):
        pass
    os.replace(path + ".tmp", path)


def die(how):
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segfault":
        ctypes.string_at(0)
    raise AssertionError(how)


def die_once(marker):
    """Die the first time (marker file absent), succeed after."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(5)
    return "survived"


def fail_until(marker, n):
    """Raise until called n times (counts in a file)."""
    count = int(open(marker).read()) if os.path.exists(marker) else 0
    with open(marker, "w") as f:
        f.write(str(count + 1))
    if count + 1 < n:
        raise RuntimeError(f"attempt {count + 1}")
    return count + 1


def stamp_until(path, n):
    """Append this attempt's start time (``time.time()``) to ``path``; raise until there are ``n``
    lines (the retry tests read the gaps between attempts from them)."""
    append_line(path, repr(time.time()))
    count = len(open(path).read().splitlines())
    if count < n:
        raise RuntimeError(f"attempt {count}")
    return count


def fail_first(marks, hold, gate, child):
    """Each attempt ``mark``s its number in ``marks``.  The first waits for ``hold``, spawns
    a child that blocks on ``gate`` (creating ``child`` once it runs: it keeps this node's
    shoal worker busy, so the retry waits queued) and raises; a later attempt returns its
    number (tests of cancel() between attempts)."""
    n = sum(ran(marks).values()) + 1
    mark(marks, n)
    if n > 1:
        return n
    wait_for(hold)
    shoal.spawn(wait_for, gate, started=child)
    raise RuntimeError("the first attempt fails")


class Unpicklable:
    def __reduce__(self):
        raise TypeError("no pickling for you")


def unpicklable_result():
    return Unpicklable()


def touch(path):
    with open(path, "w"):
        pass
    return path


def where():
    return shoal.current_worker()


# -- nested tasks -------------------------------------------------------------------

def sfib(n):
    return n if n < 2 else sfib(n - 1) + sfib(n - 2)


def fib(n, cutoff=10):
    if n < cutoff:
        return sfib(n)
    a = shoal.spawn(fib, n - 1, cutoff)
    b = fib(n - 2, cutoff)
    return a.result() + b


def quicksort(xs, cutoff=64):
    if len(xs) <= cutoff:
        return sorted(xs)
    pivot = xs[len(xs) // 2]
    lo = [x for x in xs if x < pivot]
    mid = [x for x in xs if x == pivot]
    hi = [x for x in xs if x > pivot]
    left = shoal.spawn(quicksort, lo, cutoff)
    right = quicksort(hi, cutoff)
    return left.result() + mid + right


def tree_sum(depth, fanout):
    if depth == 0:
        return 1
    kids = [shoal.spawn(tree_sum, depth - 1, fanout) for _ in range(fanout)]
    return 1 + sum(k.result() for k in kids)


def chain(depth):
    """A path of nested tasks, each joining its only child: depth levels of help-first joins."""
    if depth == 0:
        return 0
    return shoal.spawn(chain, depth - 1).result() + 1


def child_fails():
    f = shoal.spawn(boom, "child failed")
    return f.result()


def spawn_many_and_sleep(n, s, spawned=None):
    """n children sleeping s each; ``spawned``: a file created once all are spawned."""
    futs = [shoal.spawn(sleep, s) for _ in range(n)]
    if spawned is not None:
        release(spawned)
    return sum(f.result() for f in futs)


def spawn_with_future_arg():
    a = shoal.spawn(add, 1, 2)
    b = shoal.spawn(add, a, b=10)  # a future as an argument inside a task
    return b.result()


def empty():
    return None


def empty_children(n):
    futs = [shoal.spawn(empty) for _ in range(n)]
    for f in futs:
        f.result()
    return n


def busy_spawner(n, work):
    """One task producing lots of stealable work for the other workers."""
    futs = [shoal.spawn(spin, work) for _ in range(n)]
    return [f.result() for f in futs]


def spin(k):
    x = 0
    for i in range(k):
        x += i
    return shoal.current_worker().id


def tree_sum_reporting(depth, fanout, pidfile):
    """tree_sum, but first tell the test which process runs the root."""
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    return tree_sum(depth, fanout)


def slow_leaf_tree(depth, fanout, leaf_s):
    if depth == 0:
        time.sleep(leaf_s)
        return 1
    kids = [shoal.spawn(slow_leaf_tree, depth - 1, fanout, leaf_s) for _ in range(fanout)]
    return 1 + sum(k.result() for k in kids)


def slow_tree_reporting(depth, fanout, leaf_s, pidfile):
    """slow_leaf_tree; first writes 'shoal worker pid, its parent's pid' (on dask: the dask
    worker hosting the node) to pidfile, once and atomically."""
    if not os.path.exists(pidfile):
        with open(pidfile + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        os.replace(pidfile + ".tmp", pidfile)
    return slow_leaf_tree(depth, fanout, leaf_s)


def fill_rows_nested(arr, n):
    """Spawn a child per row; stolen children re-send the SharedArray handle from a worker."""
    futs = [shoal.spawn(_fill_row, arr, i) for i in range(n)]
    return sum(f.result() for f in futs)


def _fill_row(arr, i):
    time.sleep(0.001)
    arr.array[i, :] = i
    return 1


def lone_child(started, timeout=60.0):
    """One child, and inline work that lasts until the child has started (``started`` is
    the file it creates), at most ``timeout`` s: an idle worker should take the child, or
    the parent runs it itself at the join.  (A fixed 0.3 s of inline work raced a thief
    that a loaded machine held back.)  (parent's worker id, child's worker id)."""
    child = shoal.spawn(_where_started, started)
    deadline = time.monotonic() + timeout
    while not os.path.exists(started) and time.monotonic() < deadline:
        time.sleep(0.005)
    return shoal.current_worker().id, child.result()


def _where_started(started):
    release(started)
    return shoal.current_worker().id


def fill_slices(arr, parts):
    """Spawn one child per slice of ``arr`` (a SharedArray: this machine's memory, so on dask
    the children must stay on this node); each writes its slice after some work."""
    n = arr.shape[0] // parts
    futs = [shoal.spawn(fill_one, arr, i * n, (i + 1) * n) for i in range(parts)]
    return sum(f.result() for f in futs)


def fill_one(arr, lo, hi):
    sfib(18)
    arr.array[lo:hi] = range(lo, hi)
    return hi - lo


def big_children(n, size):
    """Children with big arguments, so stolen ones cross the (smaller) worker rings in fragments."""
    futs = [shoal.spawn(len, bytes(size)) for _ in range(n)]
    return sum(f.result() for f in futs)


def offer_all(cell, values):
    """Offer each value to the BestCell; the list of offer() answers."""
    return [cell.offer(v) for v in values]


def read_cell(cell):
    return cell.value


def channel_put(chan, blobs):
    """Put each blob into the Channel; the list of put() answers."""
    return [chan.put(b) for b in blobs]


def ident(x):
    return x


def ident_kw(*args, **kwargs):
    return args, kwargs


# -- fault injection (tests/runtime/test_faults_*.py, tests/dask/test_dask_faults.py) -------


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



class ExitOnUnpickle:
    """Unpickling it calls sys.exit: a result like this once killed the driver's pump."""

    def __reduce__(self):
        import sys

        return sys.exit, (3,)


class ExitOnPickle:
    """Pickling it raises SystemExit: a result like this once killed its worker, forever."""

    def __reduce__(self):
        raise SystemExit(4)


def exit_on_unpickle():
    return ExitOnUnpickle()


def exit_on_pickle():
    return ExitOnPickle()


def c_recursion(n):
    """Recursion in C (comparing deeply nested lists): RecursionError, never a segfault."""
    x, y = [], []
    for _ in range(n):
        x, y = [x], [y]
    return x == y


def through_c(n):
    """Python recursion through a C call (map) on every level."""
    return list(map(through_c, [n - 1])) if n else 0


class CodedError(Exception):
    """An exception whose __init__ takes other arguments than its ``args``."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def raise_coded(code):
    raise CodedError(code, f"failed with code {code}")


def read_handle(f):
    return f.read()


def fork_and_return():
    """Fork; parent and child both return into the worker loop (the child should have
    called os._exit).  Returns the child's pid to the driver."""
    pid = os.fork()
    return "child" if pid == 0 else pid


def failing_chain(depth, steal_every=1):
    """A chain of joins whose bottom raises; each level sleeps a little so idle
    workers steal the next level (the error then crosses processes on the way up)."""
    if depth == 0:
        raise ValueError("bottom of the chain")
    f = shoal.spawn(failing_chain, depth - 1, steal_every)
    if depth % steal_every == 0:
        time.sleep(0.0005)
    return f.result()


def sleep_then(s, value):
    time.sleep(s)
    return value


def stolen_chain(depth):
    """A chain of joins whose levels idle workers steal (each parent sleeps briefly)."""
    if depth == 0:
        return 0
    f = shoal.spawn(stolen_chain, depth - 1)
    time.sleep(0.0005)
    return f.result() + 1


def gated_item(x, gate, started_dir):
    """A map item that blocks until ``gate`` exists; first writes the pid of its shoal
    worker's parent (on dask: the dask worker hosting the node) to ``started_dir/<x>``."""
    mark = os.path.join(started_dir, str(x))
    with open(mark + ".tmp", "w") as f:
        f.write(str(os.getppid()))
    os.replace(mark + ".tmp", mark)
    wait_for(gate)
    return x * x


def gated_tree_reporting(depth, fanout, gate, pidfile):
    """``slow_tree_reporting`` whose leaves block until ``gate`` exists (not for a time)."""
    if not os.path.exists(pidfile):
        with open(pidfile + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        os.replace(pidfile + ".tmp", pidfile)
    return _gated_tree(depth, fanout, gate)


def _gated_tree(depth, fanout, gate):
    if depth == 0:
        wait_for(gate)
        return 1
    kids = [shoal.spawn(_gated_tree, depth - 1, fanout, gate) for _ in range(fanout)]
    return 1 + sum(k.result() for k in kids)
