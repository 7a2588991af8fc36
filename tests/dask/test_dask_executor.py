"""The Executor contract on the dask backend, where it has parts of its own (claims.py):
a task waiting in a node runtime's queue (the dask worker has more threads than the node
has shoal workers, so ``run_task`` has taken it from dask already) cancels and never runs;
a running task's ``cancel()`` is False; a task still in dask's queue cancels and never
runs; a closed pilot's tasks that dask hands out later start no runtime; ``stats()``
counts a map whose item raised as failed; an unpicklable argument is named.

Real clusters (a LocalCluster of one dask worker with two threads in the default run; the
same on the command-line cluster of tests/dask_cluster.py with ``-m conformance_full``),
tasks that block on files the test creates: no outcome depends on timing.
"""

from __future__ import annotations

import os

import pytest
import rt_tasks as t
from dask_cluster import CliCluster, shoal_workers, wait_until

import shoal
from shoal.backends.dask import node


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # a LocalCluster starts it; it is no leak


@pytest.fixture(scope="module", params=[
    "localcluster", pytest.param("cli", marks=pytest.mark.conformance_full)])
def cluster(request):
    """One dask worker with 2 threads: its node runtime (1 shoal worker) takes a second
    task from dask while the first runs, and queues it (what the cancel handshake is for)."""
    if request.param == "localcluster":
        from distributed import LocalCluster

        c = LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                         dashboard_address="127.0.0.1:0")
    else:
        c = CliCluster(1, worker_args=["--nthreads", "2"])
    try:
        _warm(c)
        yield c
    finally:
        c.close()


def _warm(cluster):
    """Use every path the tests use once, so the connections dask pools are open before
    the per-test leak check counts file descriptors."""
    with _pilot(cluster) as pilot:
        fut = pilot.submit(t.inc, 1)
        fut.result(60)
        pilot.submit(t.inc, 1).cancel()  # a claim round on every dask worker
        pilot.stats()
    with _client(cluster) as client:
        client.submit(abs, -1).result(30)


def _pilot(cluster):
    if isinstance(cluster, CliCluster):
        return shoal.Pilot(backend="dask", address=cluster.address, workers=1)
    return shoal.Pilot(backend="dask", cluster=cluster, workers=1)


def _inflight(pilot) -> int:
    return sum((st or {}).get("node", {}).get("inflight", 0)
               for st in pilot.stats()["nodes"].values() if isinstance(st, dict))


def test_cancel_in_the_node_queue_never_runs(cluster, tmp_path):
    gate, started = str(tmp_path / "gate"), str(tmp_path / "started")
    with _pilot(cluster) as pilot:
        blocker = pilot.submit(t.wait_for, gate, started=started)
        wait_until(lambda: os.path.exists(started), 60, "the blocker to start")
        queued = pilot.submit(t.touch, str(tmp_path / "queued"))
        # the dask worker's second thread took it into the node runtime (1 shoal worker, busy)
        wait_until(lambda: _inflight(pilot) == 2, 60, "the node runtime to hold the second task")
        waiting = pilot.submit(t.touch, str(tmp_path / "waiting"))  # still in dask's queue
        wait_until(blocker.running, 30, "RUNNING from the node's event")
        assert not queued.running() and not waiting.running()
        assert not blocker.cancel(), "cancel() of a running task must be False"
        assert queued.cancel() and queued.cancelled()
        assert waiting.cancel() and waiting.cancelled()
        t.release(gate)
        assert blocker.result(60) == gate
        assert pilot.submit(t.inc, 1).result(60) == 2  # runs after anything queued before it
        assert not os.path.exists(tmp_path / "queued"), "a task whose cancel() was True ran"
        assert not os.path.exists(tmp_path / "waiting"), "a task whose cancel() was True ran"
        assert not blocker.cancel() and not blocker.cancelled()  # finished: False


def test_cancel_from_a_done_callback_does_not_hang(cluster, tmp_path):
    """A done-callback runs on the dask client's event loop, which the claim round needs:
    cancel() there answers False at once (never True for a task that runs) and the task
    delivers its result (claims.py, "Left open")."""
    gate = str(tmp_path / "gate")
    with _pilot(cluster) as pilot:
        first = pilot.submit(t.wait_for, gate)
        later = pilot.submit(t.inc, 41)
        answers = []
        first.add_done_callback(lambda f: answers.append(later.cancel()))
        t.release(gate)
        assert first.result(60) == gate
        wait_until(lambda: answers, 30, "the done-callback")
        assert answers == [False] and later.result(60) == 42


def test_shutdown_cancel_futures_spares_the_started(cluster, tmp_path):
    gate, started = str(tmp_path / "gate"), str(tmp_path / "started")
    pilot = _pilot(cluster)
    blocker = pilot.submit(t.wait_for, gate, started=started)
    wait_until(lambda: os.path.exists(started), 60, "the blocker to start")
    queued = [pilot.submit(t.touch, str(tmp_path / f"q{i}")) for i in range(6)]
    wait_until(lambda: _inflight(pilot) == 2, 60, "the node runtime to hold a queued task")
    pilot.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued) and not blocker.cancelled()
    t.release(gate)
    pilot.shutdown(wait=True)
    assert blocker.result(0) == gate
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("q")], "a cancelled task ran"


def test_a_closed_pilot_starts_no_runtime(cluster, tmp_path):
    """Tasks dask still hands out after close(cancel_pending=True) start no fresh node
    runtime (before: one started, lived until the idle reaper, and replaced killed workers)."""
    gate, started = str(tmp_path / "gate"), str(tmp_path / "started")
    before = set(_all_shoal_workers(cluster))
    pilot = _pilot(cluster)
    pilot.submit(t.wait_for, gate, started=started)
    wait_until(lambda: os.path.exists(started), 60, "the blocker to start")
    queued = [pilot.submit(t.inc, i) for i in range(10)]
    t.release(gate)  # the blocker may finish or be stopped (else close waits 5 s to kill it)
    pilot.close(cancel_pending=True)
    assert all(f.done() for f in queued) and any(f.cancelled() for f in queued)
    token = pilot._backend.token
    with _client(cluster) as client:
        # a task of the closed pilot arriving now (what dask hands out late) refuses to start
        cfg = node.NodeConfig(token, 1)
        assert client.submit(node.run_task, cfg, pilot._backend._blob(t.inc), (1,), {}, None,
                             pure=False).result(30) == "shoal:cancelled-before-start"
    wait_until(lambda: set(_all_shoal_workers(cluster)) <= before, 20,
               "the closed pilot's shoal workers to exit")


def test_stats_count_a_failed_map(cluster):
    with _pilot(cluster) as pilot:
        with pytest.raises(ValueError, match="bad item"):
            list(pilot.map(t.boom, ["bad item"] * 3))
        assert pilot.stats()["driver"]["failed"] >= 1


def test_unpicklable_argument_is_named(cluster):
    with _pilot(cluster) as pilot:
        with pytest.raises(shoal.PicklingError, match=r"add: keyword argument 'b' \(Unpicklable\)"):
            pilot.submit(t.add, 1, b=t.Unpicklable()).result(30)
        with pytest.raises(shoal.PicklingError, match=r"argument 0 \(Unpicklable\)"):
            pilot.submit(t.inc, t.Unpicklable()).result(30)


def _client(cluster):
    from distributed import Client

    return Client(cluster.address if isinstance(cluster, CliCluster) else cluster,
                  set_as_default=False)


def _all_shoal_workers(cluster):
    if isinstance(cluster, CliCluster):
        return [w for proc in cluster.workers for w in shoal_workers(proc.pid)]
    return shoal_workers()


def _claim_entries(token: str) -> int:
    from shoal.backends.dask import node as n

    claims = n._claims.get(token)
    return 0 if claims is None else len(claims.entries)


def test_claims_do_not_grow_with_finished_tasks(cluster):
    """The node's claim entries of finished tasks go once dask releases their results, so a
    long-lived pilot does not accumulate one per task."""
    with _pilot(cluster) as pilot, _client(cluster) as client:
        token = pilot._backend.token

        def round_then_entries():  # each round's futures are dropped: dask releases them
            assert sum(f.result(60) for f in [pilot.submit(t.inc, i) for i in range(100)]) == 5050
            return sum(client.run(_claim_entries, token).values())

        wait_until(lambda: round_then_entries() < 200, 60,
                   "the claims of released tasks to be pruned")


def test_cancel_many_is_one_claim_round(cluster, tmp_path):
    """``pilot.cancel_many`` on a dask pilot: one claim round for every pending future (a
    loop of ``cancel()`` pays one each); the answers are ``cancel()``'s."""
    gate, started = str(tmp_path / "gate"), str(tmp_path / "started")
    with _pilot(cluster) as pilot:
        blocker = pilot.submit(t.wait_for, gate, started=started)
        wait_until(lambda: os.path.exists(started), 60, "the blocker to start")
        queued = [pilot.submit(t.touch, str(tmp_path / f"q{i}")) for i in range(8)]
        backend, rounds = pilot._backend, []
        real = backend._round

        async def counted(*args):
            rounds.append(1)
            return await real(*args)

        backend._round = counted
        with blocker._condition:  # as if its STARTED event were still on its way
            blocker._state = "PENDING"
        assert pilot.cancel_many([blocker, *queued]) == [False] + [True] * 8
        assert len(rounds) == 1
        t.release(gate)
        assert blocker.result(60) == gate
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("q")], "a cancelled task ran"
