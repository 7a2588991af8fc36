"""Task functions for the integration tests (module-level: workers import them by name)."""

from __future__ import annotations


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def boom(x):
    raise ValueError(f"boom {x}")


def spin(n):
    """CPU-bound pure Python (holds the GIL)."""
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


class DriverRefuses:
    """A value that cannot be unpickled in the driver process (pid ``driver``): it may
    travel between workers, and a graph result that crosses the driver fails loudly."""

    def __init__(self, value, driver: int):
        self.value, self.driver = value, driver

    def __reduce__(self):
        return _rebuild_refusing, (self.value, self.driver)


def _rebuild_refusing(value, driver):
    import os

    if os.getpid() == driver:
        raise RuntimeError(f"an intermediate result ({value!r}) reached the driver")
    return DriverRefuses(value, driver)


def make_refusing(i, driver):
    return DriverRefuses(i, driver)


def combine_refusing(a, b):
    return DriverRefuses(a.value + b.value, a.driver)


def unwrap(x):
    return x.value


# -- joblib backend (tests/integrations/test_joblib_backend.py) -----------------------------


def write_into(memmap, i):
    """A task's write into the caller's memmap (joblib's documented pattern)."""
    memmap[i] = i + 1
    return i


def array_kind(a):
    """How an array argument arrived: (type name, writeable, file name or None)."""
    import numpy as np

    return type(a).__name__, bool(a.flags.writeable), (a.filename if isinstance(a, np.memmap) else None)


def getpid(_=None):
    import os

    return os.getpid()


def rendezvous(folder, i, k, timeout=60.0):
    """Wait (bounded) until ``k`` tasks have arrived in ``folder``: True when they all did,
    i.e. ``k`` of them ran at the same time; False after ``timeout``."""
    import os
    import time

    open(os.path.join(folder, str(i)), "w").close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(os.listdir(folder)) >= k:
            return True
        time.sleep(0.01)
    return False


def running_at_once(folder, i, pause=0.3):
    """How many tasks are in ``folder`` while this one is (its file is there for ``pause``)."""
    import os
    import time

    path = os.path.join(folder, str(i))
    open(path, "w").close()
    try:
        time.sleep(pause)
        return len(os.listdir(folder))
    finally:
        os.remove(path)


def nested_parallel(n, n_jobs=2):
    """A task that runs joblib itself with the shoal backend (joblib is first imported here,
    in the worker: the backend must be registered there)."""
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, backend="shoal")(delayed(inc)(i) for i in range(n))


def nested_default(n):
    """A task of a shoal Parallel call that runs a nested Parallel without naming a backend."""
    from joblib import Parallel, delayed, parallel

    backend = type(parallel.get_active_backend()[0]).__name__
    return backend, Parallel(n_jobs=2)(delayed(inc)(i) for i in range(n))


def touch_pid(folder):
    """An initializer: a file named after this worker's pid."""
    import os

    open(os.path.join(folder, str(os.getpid())), "w").close()


def initialized_here(folder, _=None):
    import os

    return os.path.exists(os.path.join(folder, str(os.getpid())))
