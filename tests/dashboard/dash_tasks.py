"""Task functions and helpers for the dashboard tests (module-level, so workers import them)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request


def nap(seconds: float, x=None):
    time.sleep(seconds)
    return x


def my_pid() -> int:
    return os.getpid()


def queens_children(n: int, node: tuple) -> list:
    """N-Queens partial placements (a column per row): children are the safe next rows."""
    if len(node) == n:
        return []
    row = len(node)
    return [node + (c,) for c in range(n)
            if all(c != q and abs(c - q) != row - r for r, q in enumerate(node))]


def slow_queens_children(n: int, node: tuple) -> list:
    """queens_children with a 2 ms pause per node above depth 5 (3,106 nodes for n = 11), so
    a search lasts seconds however fast the machine: long enough for a page to watch it."""
    if len(node) < 5:
        time.sleep(0.002)
    return queens_children(n, node)


def is_solution(n: int, node: tuple) -> bool:
    return len(node) == n


def get_state(url: str) -> dict:
    with urllib.request.urlopen(url.rstrip("/") + "/api/state", timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def in_background(fn, *args, timeout: float = 120.0, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a thread; yield an Event that is set when it has ended.
    On leaving, the thread is joined (bounded) and what it raised is raised here."""
    done = threading.Event()
    errors: list = []

    def go():
        try:
            fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        thread.join(timeout)
    assert not thread.is_alive(), f"{fn.__name__} still running after {timeout} s"
    if errors:
        raise errors[0]


def wait_for(predicate, timeout: float = 30.0, every: float = 0.1):
    """Poll ``predicate()`` until it returns something true; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"not true after {timeout} s (last: {last!r})")


def bits_children(depth: int, node: tuple) -> list:
    return [] if len(node) == depth else [node + (0,), node + (1,)]


def bits_distance(target: int, depth: int, node: tuple) -> int:
    """(binary value - target)^2 for a full-length node; internal nodes score a large value."""
    if len(node) < depth:
        return 10**9
    return (int("".join(map(str, node)), 2) - target) ** 2


def zero(node) -> int:
    return 0
