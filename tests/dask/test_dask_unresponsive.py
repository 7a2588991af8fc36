"""One dask worker that does not answer (SIGSTOPped) or dies during a cancel (SIGKILLed):
``cancel()``, ``running()`` and ``shutdown(wait=False, cancel_futures=True)`` stay bounded
and never call a task cancelled that runs (shoal/backends/dask/cancel.py, claims.py).

Before: a claim round asked every dask worker and waited up to 30 s for each, so one stopped
worker made every ``cancel()``/``running()`` wait 30 s, and ``shutdown(wait=False,
cancel_futures=True)`` blocked 30 s; a holder killed during the round counted as "not
holding", so ``cancel()`` said True for a task that had started, and the task's re-run on
another worker met a tombstone and ended ``CancelledError``.

Real clusters (2 dask worker processes of 1 thread, 1 shoal worker each, a fresh cluster
per test since each stops or kills a worker: a LocalCluster in the default run, the
command-line cluster of tests/dask_cluster.py with ``-m conformance_full``); every task
blocks on a file the test creates after the stop/kill, and writes O_APPEND marks (the side
effect checked).  The bounds asserted (10 s, against the 30 s before) are generous: the
claim wait is 2 s here.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import fail_tasks as ft
import psutil
import pytest
import rt_tasks as t
from dask_cluster import CliCluster, wait_until

import shoal
from shoal.backends.dask import cancel as dcancel

BOUND_S = 10.0


@pytest.fixture(autouse=True)
def _short_claim_wait(monkeypatch):
    monkeypatch.setattr(dcancel, "CLAIM_TIMEOUT_S", 2.0)


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # a LocalCluster starts it; it is no leak


@pytest.fixture(params=["localcluster", pytest.param("cli", marks=pytest.mark.conformance_full)])
def cluster(request):
    """A fresh cluster of 2 dask workers of 1 thread: a LocalCluster, or (``-m
    conformance_full``) `dask scheduler` + `dask worker` processes (tests/dask_cluster.py)."""
    if request.param == "cli":
        c = CliCluster(2)
    else:
        from distributed import LocalCluster

        c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address="127.0.0.1:0")
    c.stopped = []  # pids a test SIGSTOPped: resumed before the close (else it hangs)
    try:
        yield c
    finally:
        for pid in c.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        c.close()


def _pilot(cluster):
    if isinstance(cluster, CliCluster):
        return shoal.Pilot(backend="dask", address=cluster.address, workers=1)
    return shoal.Pilot(backend="dask", cluster=cluster, workers=1)


def _stop(cluster, pid: int) -> None:
    cluster.stopped.append(pid)
    os.kill(pid, signal.SIGSTOP)


def _holder(pilot, marks: str, name: str) -> int:
    """Pid of the dask worker process whose node runs task ``name`` (an ancestor of it)."""
    pid = ft.starts(marks)[name][-1]
    workers = set(pilot._backend.client.run(os.getpid).values())
    [holder] = [p.pid for p in psutil.Process(pid).parents() if p.pid in workers]
    return holder


def _timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


def test_a_stopped_worker_bounds_cancel_running_and_shutdown(cluster, tmp_path):
    marks, gate = str(tmp_path / "marks"), str(tmp_path / "gate")
    pilot = _pilot(cluster)
    try:
        a = pilot.submit(t.marked_gate, marks, "a", gate)
        b = pilot.submit(t.marked_gate, marks, "b", gate)
        wait_until(lambda: {"a", "b"} <= set(ft.starts(marks)), 60, "both blockers to start")
        wait_until(lambda: a.running() and b.running(), 30, "RUNNING from the nodes' events")
        # running() asks nobody: with every round trip refused it still answers
        client = pilot._backend.client
        real_run, client.run = client.run, _refuse
        try:
            assert a.running() and b.running()
        finally:
            client.run = real_run
        stopped = _holder(pilot, marks, "b")
        _stop(cluster, stopped)
        queued = [pilot.submit(t.marked_gate, marks, f"q{i}", gate) for i in range(4)]
        assert a.running() and not a.cancel()  # a runs on the worker that answers: at once
        # the claim round (what cancel() runs before the STARTED event is in) asks only the
        # holder; b's holder is stopped: not taken, within the bound
        taken, took = _timed(pilot._backend._claim, [b])
        assert taken == [] and took < BOUND_S, (taken, took)
        answers = {}
        for q in queued:  # each on the scheduler, the answering worker or the stopped one
            answers[q], took = _timed(q.cancel)
            assert took < BOUND_S, f"cancel() took {took:.1f} s"
        # force cancel asks only a's holder too (before: every worker, 30 s for the stopped one)
        forced, took = _timed(lambda: pilot.cancel(a, force=True))
        assert forced and a.cancelled() and took < BOUND_S, (forced, took)
        _, took = _timed(lambda: pilot.shutdown(wait=False, cancel_futures=True))
        assert took < BOUND_S, f"shutdown(wait=False) took {took:.1f} s"
        os.kill(stopped, signal.SIGCONT)
        t.release(gate)
        pilot.shutdown(wait=True)
        assert b.result(0) == "b"
        ran = ft.starts(marks)
        for i, q in enumerate(queued):
            if q.cancelled():
                assert f"q{i}" not in ran, f"q{i} ran although cancelled (cancel() -> {answers[q]})"
            else:
                assert not answers[q] and q.result(0) == f"q{i}"
    finally:
        t.release(gate)
        pilot.close()


def _refuse(*args, **kwargs):
    raise AssertionError("running() made a round trip")


def test_a_holder_killed_during_the_round_never_gives_true(cluster, tmp_path):
    """D2: the task has started on W (its mark is written); W is stopped, the cancel's claim
    round asks it, and W is SIGKILLed 1 s later.  Before: True, and dask's re-run on the
    other worker met the round's tombstone there and ended CancelledError."""
    marks, gate = str(tmp_path / "marks"), str(tmp_path / "gate")
    pilot = _pilot(cluster)
    try:
        fut = pilot.submit(t.marked_gate, marks, "a", gate)
        wait_until(lambda: "a" in ft.starts(marks), 60, "the task to start")
        holder = _holder(pilot, marks, "a")
        _stop(cluster, holder)
        killer = threading.Timer(1.0, os.kill, (holder, signal.SIGKILL))
        killer.start()
        with fut._condition:  # as if the node's STARTED event were still on its way
            fut._state = "PENDING"
        answer, took = _timed(fut.cancel)
        killer.join()
        assert answer is False and not fut.cancelled(), "cancel() True for a started task"
        assert took < BOUND_S
        t.release(gate)
        assert fut.result(60) == "a"  # dask ran it again on the other worker: no tombstone
        assert len(ft.starts(marks)["a"]) == 2
    finally:
        t.release(gate)
        pilot.close()
