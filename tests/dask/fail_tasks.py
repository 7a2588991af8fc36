"""Task functions of tests/dask/test_dask_unresponsive.py (imported by the dask workers)."""

from __future__ import annotations

import os
import time


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def marked_gate(marks: str, name: str, gate: str, timeout: float = 120.0) -> str:
    """Append ``start <name> <pid>`` to ``marks`` (O_APPEND: the side effect the test
    checks), block until ``gate`` exists, append ``end <name>``; ``name`` as the result."""
    _append(marks, f"start {name} {os.getpid()}")
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody created {gate}")
        time.sleep(0.01)
    _append(marks, f"end {name}")
    return name


def starts(marks: str) -> dict[str, list[int]]:
    """``{name: [pid of each start]}`` from a marks file (the test's side)."""
    out: dict[str, list[int]] = {}
    if not os.path.exists(marks):
        return out
    with open(marks) as f:
        for line in f:
            word, name, *rest = line.split()
            if word == "start":
                out.setdefault(name, []).append(int(rest[0]))
    return out
