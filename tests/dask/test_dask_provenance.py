"""What an attempt used, recorded on a dask pilot as on the local backend (usage.py): an
executable measured by its node's wait4 and /proc, a function task in its shoal worker;
the host is the node's and the node runtime its shoal worker."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import sys

import pytest
from dask_cluster import local_cluster, shoal_workers, wait_until

import shoal
from shoal.ensemble import Pipeline, Stage, Task, run

pytestmark = pytest.mark.fd_slack(8)
MIB = 1 << 20
ALLOC = 200 * MIB


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    """multiprocessing's resource tracker (started by the first LocalCluster) lives as long
    as this process: start it before the per-test leak check looks, it is no leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def _alloc(n):
    block = b"\x01" * n
    return len(block)


def test_executables_and_functions_on_dask_record_what_they_used(tmp_path):
    db = str(tmp_path / "run.db")
    exe = Task(executable=sys.executable, arguments=["-c", f"b = b'\\x01' * {ALLOC}"], name="exe")
    fn = Task(function=_alloc, args=(ALLOC,), name="fn")
    bad = Task(executable=sys.executable, arguments=["-c", "raise SystemExit(5)"], name="bad")
    cluster = local_cluster(1)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
            report = run(Pipeline([Stage([exe, fn, bad])], name="p"), pilot=pilot, journal=db)
    finally:
        cluster.close()
    wait_until(lambda: not shoal_workers(), 20, "the pilot's shoal workers to exit")
    assert report.done == 2 and report.failed == 1
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.row_factory = sqlite3.Row
        rows = {r["uid"]: dict(r) for r in c.execute("SELECT * FROM tasks")}
    assert abs(rows["p.s0.exe"]["max_rss"] - ALLOC) <= 0.1 * ALLOC
    assert rows["p.s0.fn"]["max_rss"] >= ALLOC  # the worker process's peak during the call
    assert rows["p.s0.bad"]["exit_code"] == 5 and rows["p.s0.bad"]["cpu_user"] is not None
    for row in rows.values():
        assert row["host"] == socket.gethostname() and row["node"].startswith("worker ")
        assert row["read_chars"] > 0 or row["uid"] == "p.s0.fn"
