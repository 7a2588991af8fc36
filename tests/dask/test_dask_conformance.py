"""Executor conformance: the same tests on the local backend, on dask with a LocalCluster,
and on dask with a `dask scheduler` + two `dask worker` processes started from the command
line.  Each dask worker hosts a node runtime of one shoal worker (``workers=1``), so the
2-core test machine is not oversubscribed much.

The clusters live for the module (started before the per-test leak check looks); every
test opens and closes its own Pilot, so the leak check also sees that closing a dask pilot
stops the shoal worker processes it started inside the dask workers.
"""

from __future__ import annotations

import concurrent.futures as cf
import os

import dask_tasks as t
import pytest
from dask_cluster import (  # noqa: F401 - clusters, pilot: fixtures
    BACKENDS,
    clusters,
    pilot,
    shoal_workers,
    wait_until,
)

import shoal
from shoal.workloads import nqueens

# dask pools connections to the module-scoped clusters; more open under concurrency
pytestmark = pytest.mark.fd_slack(8)


@pytest.fixture(scope="module", params=BACKENDS)
def kind(request, clusters):
    # start the cluster here, at module scope, before the per-test leak check snapshots
    clusters.warm(request.param)
    return request.param


def test_submit_result(pilot):
    assert pilot.submit(t.inc, 1).result(30) == 2
    assert pilot.submit(t.add, 1, b=2).result(30) == 3
    assert isinstance(pilot.submit(t.inc, 1), cf.Future)


def test_exception_with_remote_traceback(pilot):
    fut = pilot.submit(t.boom, "bad input")
    with pytest.raises(ValueError, match="bad input") as info:
        fut.result(30)
    cause = info.value.__cause__
    assert isinstance(cause, shoal.RemoteTraceback)
    assert "in boom" in cause.tb and "dask_tasks.py" in cause.tb


def test_many_submits_and_wait(pilot):
    futs = [pilot.submit(t.inc, i) for i in range(100)]
    done, not_done = cf.wait(futs, timeout=60)
    assert not not_done
    assert sorted(f.result() for f in cf.as_completed(futs)) == list(range(1, 101))


def test_map_ordered_unordered(pilot):
    assert list(pilot.map(t.inc, range(500))) == list(range(1, 501))
    assert sorted(pilot.map(t.inc, range(500), ordered=False)) == list(range(1, 501))
    assert list(pilot.map(t.add, range(50), range(0, 100, 2))) == [3 * i for i in range(50)]
    assert list(pilot.map(t.inc, (i for i in range(30)), chunksize=7)) == list(range(1, 31))
    assert list(pilot.map(t.inc, [])) == []


def test_map_error(pilot):
    with pytest.raises(ValueError, match="boom"):
        list(pilot.map(t.boom, ["boom"] * 3))


def test_graph_with_futures(pilot):
    parts = [pilot.submit(t.inc, i) for i in range(10)]
    assert pilot.submit(t.total, parts).result(30) == sum(range(1, 11))
    d = pilot.submit(t.mapping_sum, {"a": pilot.submit(t.inc, 1), "b": 5})
    assert d.result(30) == 7
    x = pilot.submit(t.inc, 0)
    for _ in range(20):
        x = pilot.submit(t.inc, x)
    assert x.result(60) == 21


def test_graph_error_propagates(pilot):
    bad = pilot.submit(t.boom, "upstream")
    with pytest.raises(ValueError, match="upstream"):
        pilot.submit(t.inc, bad).result(30)


def test_spawn_inside_tasks(pilot):
    assert pilot.submit(t.fib, 22, 12).result(60) == t.sfib(22)
    assert pilot.submit(t.chain, 1000).result(60) == 1000


def test_nqueens(pilot):
    assert nqueens.count_parallel(pilot, 8) == nqueens.OEIS_A000170[8]


def test_retries(pilot, tmp_path):
    marker = str(tmp_path / "count")
    assert pilot.options(retries=2).submit(t.fail_until, marker, 3).result(60) == 3
    marker2 = str(tmp_path / "count2")
    with pytest.raises(RuntimeError, match="attempt 2"):
        pilot.options(retries=1).submit(t.fail_until, marker2, 5).result(60)


def test_timeout(pilot):
    with pytest.raises(shoal.TaskTimeout):
        pilot.options(timeout=0.5).submit(t.sleep, 30).result(60)
    assert pilot.submit(t.inc, 1).result(30) == 2  # the node replaced its worker


def test_cancel(pilot):
    blockers = [pilot.submit(t.sleep, 0.5) for _ in range(4)]
    queued = [pilot.submit(t.inc, i) for i in range(5)]
    assert queued[-1].cancel()
    assert queued[-1].cancelled()
    with pytest.raises(cf.CancelledError):
        queued[-1].result()
    assert [f.result(60) for f in queued[:-1]] == [1, 2, 3, 4]
    assert all(b.result(60) == 0.5 for b in blockers)


def test_stats(pilot):
    pilot.submit(t.inc, 1).result(30)
    stats = pilot.stats()
    assert stats["backend"] in ("local", "dask")
    assert stats["workers"] and all("tasks_run" in w for w in stats["workers"])
    assert sum(w["tasks_run"] for w in stats["workers"]) >= 1
    assert "outstanding" in stats["driver"]


def test_current_worker_runs_on_a_node(pilot):
    wid, pid, parent = pilot.submit(t.where).result(30)
    assert wid >= 1 and pid != os.getpid()
    assert pilot.workers >= 1


def test_closed_pilot_refuses(pilot):
    pilot.close()
    with pytest.raises(shoal.PilotClosed):
        pilot.submit(t.inc, 1)
