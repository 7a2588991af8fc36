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
