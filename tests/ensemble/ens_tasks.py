"""Task functions and helpers for the ensemble tests (module-level, so pilot workers import them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def square(x):
    return x * x


def add(a, b):
    return a + b


def boom(msg="boom"):
    raise ValueError(msg)


def nap(seconds):
    time.sleep(seconds)
    return seconds


def touch_count(path):
    """Append one line to ``path`` (a side effect to count runs)."""
    with open(path, "a") as f:
        f.write("x\n")
    return 1


def flaky(path, failures):
    """Fail the first ``failures`` calls (counted in ``path``), then return the call number."""
    n = len(Path(path).read_text().splitlines()) if os.path.exists(path) else 0
    touch_count(path)
    if n < failures:
        raise RuntimeError(f"flaky failure {n + 1}")
    return n + 1


def run_py(script: str, *args, timeout=120, cwd=None):
    """Run a Python file with shoal importable; returns CompletedProcess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def cpu_view():
    """(CPUs this task may run on, OMP_NUM_THREADS) as the task sees them."""
    return len(os.sched_getaffinity(0)), os.environ.get("OMP_NUM_THREADS")


def make_value():
    """Plain data the journal's data format must give back unchanged (tuple, set, int keys, bigint, array)."""
    import numpy as np

    return {"t": (1, 2), "s": {3}, 7: 2 ** 80, "a": np.arange(4).reshape(2, 2)}


class Thing:
    def __init__(self, x):
        self.x = x


def make_object():
    return Thing(5)


def read_text(path):
    with open(path) as f:
        return f.read()


def alloc_bytes(n):
    """Allocate and touch ``n`` bytes (every page written), then free them."""
    block = b"\x01" * n
    return len(block)


def busy_cpu(seconds):
    """Spin for ``seconds`` of CPU; the CPU this process measured of itself over the call."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
