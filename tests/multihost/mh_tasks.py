"""Tasks for the multi-host tests (module-level: the test bed's dask workers import them by
name; scripts/testbed puts tests/multihost on their PYTHONPATH)."""

from __future__ import annotations

import os
import socket
import tempfile
import time

from rt_tasks import append_line, wait_for


def where(i):
    """(host, i): which host ran the task."""
    return socket.gethostname(), i


def leave_temp_file(name: str):
    """Write ``name`` in this host's temp folder; (host, path)."""
    path = os.path.join(tempfile.gettempdir(), name)
    with open(path, "w") as f:
        f.write(socket.gethostname())
    return socket.gethostname(), path


def exists(path: str):
    """(host, whether ``path`` exists on this host)."""
    return socket.gethostname(), os.path.exists(path)


def remove(path: str) -> None:
    os.unlink(path)


def gated(i, gate: str, marks: str, timeout: float = 240.0):
    """Append ``start i HOST`` to ``marks``, block until ``gate`` exists, append ``end i HOST``;
    ``i * i``.  The marks file is on the shared filesystem."""
    host = socket.gethostname()
    append_line(marks, f"start {i} {host}")
    wait_for(gate, timeout)
    append_line(marks, f"end {i} {host}")
    return i * i


def marks_of(path: str) -> list[tuple[str, int, str]]:
    """(start|end, i, host) lines of a marks file."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(a, int(b), c) for a, b, c in (line.split() for line in f if line.strip())]


def echo(blob: bytes, pause: float = 0.0):
    """(host, len, blob back): a task whose argument and result cross the link."""
    if pause:
        time.sleep(pause)
    return socket.gethostname(), len(blob), blob


def mean_of(arr) -> float:
    return float(arr.array.mean())


def size_diff(a, b):
    return abs(a - b)


def cdist_noting_host(folder: str, rows, cols):
    """scipy's cdist of a strip, after a line naming this host in ``folder``/hosts."""
    from scipy.spatial.distance import cdist

    append_line(os.path.join(folder, "hosts"), socket.gethostname())
    return cdist(rows, cols)


def gated_size_diff(gate: str, marks: str, a, b):
    """``size_diff`` after a ``start`` line naming this host in ``marks`` and the ``gate``
    file (so the test can crash a host while its tiles run)."""
    append_line(marks, f"start {a} {socket.gethostname()}")
    wait_for(gate, 240)
    return abs(a - b)


def euclid(a, b):
    return float(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5)


def fails_on_3_5(a, b):
    if {a, b} == {3, 5}:
        raise ZeroDivisionError("boom")
    return float(a - b)


def slow_in_the_corner(a, b):
    """``size_diff``, 50 ms a pair in the 8 x 8 corner: one block outlasts all the others,
    so the hosts that finished theirs take its tiles (the balancer lends them)."""
    if a < 8 and b < 8:
        time.sleep(0.05)
    return abs(a - b)
