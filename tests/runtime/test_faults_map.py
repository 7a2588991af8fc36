"""Issue 11, the map items: bytes-bounded window (7) and the results before a failing item (10).

Real pilots; the memory test measures the driver's and the workers' peak RSS in a
fresh interpreter (``ru_maxrss``), the way the issue's report did.
"""

from __future__ import annotations

import json

import pytest
import rt_tasks as t
from conftest import run_script

import shoal
from shoal.runtime import mapping


def fail_at(x, bad=500):
    if x == bad:
        raise ValueError(f"item {x} is bad")
    return x


@pytest.mark.parametrize("ordered", [True, False])
def test_results_before_the_failing_item_are_kept(ordered):
    """One batch holds all 1,000 items; item 500 raises.  The 500 results before it
    arrive, then its error with the worker's traceback (before: none arrived)."""
    got = []
    with shoal.Pilot(2) as pilot:
        with pytest.raises(ValueError, match="item 500 is bad") as info:
            for x in pilot.map(fail_at, range(1000), chunksize=1000, ordered=ordered):
                got.append(x)
        assert got == list(range(500))
        assert isinstance(info.value.__cause__, shoal.RemoteTraceback)
        assert "fail_at" in str(info.value.__cause__)
        # the adaptive path (many batches): every result before the failure, in order
        got = []
        with pytest.raises(ValueError):
            for x in pilot.map(fail_at, range(5000), ordered=True):
                got.append(x)
        assert got == list(range(500))
        assert pilot.submit(t.inc, 1).result(30) == 2  # the pilot goes on


def test_window_bytes_is_validated():
    with shoal.Pilot(1) as pilot:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="window_bytes"):
                pilot.map(t.inc, [1], window_bytes=bad)


_MEMORY = """
import json, os, resource, shoal
def size(b):
    return len(b)
def peak():
    return os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
if __name__ == '__main__':
    with shoal.Pilot(2) as pilot:
        base = {pid: mb for pid, mb in (pilot.submit(peak).result(60) for _ in range(20))}
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        items = (bytes([i % 256]) * _ITEM_ for i in range(_N_))
        total = sum(pilot.map(size, items, window_bytes=_WINDOW_))
        driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - start
        workers = {pid: mb for pid, mb in (pilot.submit(peak).result(60) for _ in range(40))}
    print(json.dumps({"total": total, "driver_mb": driver, "workers_mb": workers, "base": base}))
"""


def _peaks(n: int, item: int, window: int) -> dict:
    code = _MEMORY.replace("_ITEM_", str(item)).replace("_N_", str(n)).replace("_WINDOW_", str(window))
    res = run_script(code, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["total"] == n * item
    return out


def test_map_memory_is_bounded_by_bytes():
    """20,000 items of 10 KB (200 MB) from a generator through an 8 MiB window: the
    driver's and each worker's peak stay far below the data size (before: the whole
    input was in flight, ~200 MB in the driver alone)."""
    out = _peaks(20_000, 10_000, 8 << 20)
    assert out["driver_mb"] < 80, out
    assert max(out["workers_mb"].values()) < 150, out


@pytest.mark.slow
def test_map_memory_issue_scale():
    """The issue's case: 200,000 items of 10 KB with the default window (64 MiB)."""
    out = _peaks(200_000, 10_000, mapping.WINDOW_BYTES)
    assert out["driver_mb"] < 400, out
    assert max(out["workers_mb"].values()) < 400, out
