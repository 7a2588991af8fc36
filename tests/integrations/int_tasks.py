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
