"""pilot.options(priority=) on the dask backend reaches dask's scheduler: with the one worker
busy, tasks submitted later with a higher priority start before those submitted earlier
that still wait in dask's scheduler (the order from the marks the tasks write; the few a
dask worker has already been handed, up to its worker-saturation, run in the order sent); retry_delay is refused there in one line, since
dask's own retries re-run a failed task at once."""

from __future__ import annotations

import os

import pytest
import rt_tasks as t
from dask_cluster import local_cluster, shoal_workers, wait_until

import shoal

pytestmark = pytest.mark.fd_slack(8)


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    """multiprocessing's resource tracker (started by the first LocalCluster) lives as long
    as this process: start it before the per-test leak check looks, it is no leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def test_higher_priority_tasks_start_first_on_dask(tmp_path):
    marks, gate, started = (str(tmp_path / n) for n in ("marks", "gate", "started"))
    cluster = local_cluster(1)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
            blocker = pilot.submit(t.wait_for, gate, 120, None, started)
            t.until(lambda: os.path.exists(started), what="the blocking task to start")
            low = [pilot.options(priority=0).submit(t.mark, marks, i) for i in range(20)]
            high = [pilot.options(priority=10).submit(t.mark, marks, 100 + i) for i in range(5)]
            t.release(gate)
            for f in [blocker, *low, *high]:
                f.result(timeout=120)
            with pytest.raises(ValueError, match="retry_delay=1: on the dask backend retries are dask's own"):
                pilot.options(retries=1, retry_delay=1).submit(t.inc, 1)
    finally:
        cluster.close()
    wait_until(lambda: not shoal_workers(), 20, "the pilot's shoal workers to exit")
    with open(marks) as f:
        order = [int(x) for x in f.read().split()]
    highs = [order.index(100 + i) for i in range(5)]
    queued_lows = [order.index(i) for i in range(10, 20)]  # never handed to the worker early
    assert max(highs) < min(queued_lows), order


def test_ensemble_priority_and_retry_delay_on_a_dask_pilot(tmp_path):
    """The ensemble engine orders and delays its tasks itself, so both hold on dask as on the
    local backend: high-priority tasks start first (journal start times), and a retry waits
    its retry_delay after the failed attempt (journal: failed_attempts, then the task's row)."""
    import contextlib
    import sqlite3

    from shoal.ensemble import Pipeline, Stage, Task, run

    db = str(tmp_path / "run.db")
    low = [Task(function=t.inc, args=(i,), name=f"low{i}") for i in range(12)]
    high = [Task(function=t.inc, args=(i,), name=f"high{i}", priority=5) for i in range(4)]
    flaky = Task(function=t.stamp_until, args=(str(tmp_path / "stamps"), 2), retries=1, retry_delay=0.3,
                 name="flaky")
    cluster = local_cluster(1)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
            report = run(Pipeline([Stage(low + high), Stage([flaky])]), pilot=pilot, journal=db)
    finally:
        cluster.close()
    wait_until(lambda: not shoal_workers(), 20, "the pilot's shoal workers to exit")
    assert report.ok and report.retries == 1
    with contextlib.closing(sqlite3.connect(db)) as c:
        started = dict(c.execute("SELECT uid, started FROM tasks"))
        (failed_end,) = c.execute("SELECT finished FROM failed_attempts WHERE uid='p0.s1.flaky'").fetchone()
    assert max(started[f"p0.s0.high{i}"] for i in range(4)) <= min(started[f"p0.s0.low{i}"] for i in range(12))
    assert started["p0.s1.flaky"] - failed_end >= 0.3 - 0.005
